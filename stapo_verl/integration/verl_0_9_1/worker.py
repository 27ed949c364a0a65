"""The series' worker methods (:mod:`stapo_verl.core.engine_workers`) on verl 0.9.1's ``engine_workers`` (ledger:
:data:`..PATCHES`), each behind a dispatcher that hands a worker without a pre-pass verl's own method; ``init_model``
gives a masked actor the series' loss and mask pre-pass. A pre-pass with ``around_train_batch(worker, data,
train_batch)`` (the plugin's options, :class:`.training_worker.StapoPrepareBatch`) runs the series' method itself.
"""

from __future__ import annotations

import functools

from stapo_verl.core import engine_workers as series
from stapo_verl.core import losses as core_losses
from stapo_verl.integration.verl_0_9_1.job import (
    TokenMaskIntegrationError,
    asks_for_extras,
    asks_for_mask,
    record_acted,
)

_MARK = "__stapo_integration__"
_PREFIX = "verl.workers.engine_workers."


def _pre_passes(worker) -> tuple:
    """The worker's ``(prepare_batch_fn, policy_token_mask_fn)`` (None where unset)."""
    return worker.__dict__.get("prepare_batch_fn"), worker.__dict__.get("policy_token_mask_fn")


def wrap_train_batch(orig):
    """``TrainingWorker.train_batch``: verl's method without a pre-pass; the series' with one (see the module)."""

    @functools.wraps(orig)
    def train_batch(self, data):
        fns = _pre_passes(self)
        if not any(fns):
            return orig(self, data)
        record_acted(_PREFIX + "TrainingWorker.train_batch")
        self.__dict__.setdefault("prepare_batch_fn", None)  # the series' __init__ sets both
        self.__dict__.setdefault("policy_token_mask_fn", None)
        for fn in reversed(fns):
            if hasattr(fn, "around_train_batch"):
                return fn.around_train_batch(self, data, series.TrainingWorker.train_batch)
        return series.TrainingWorker.train_batch(self, data)

    setattr(train_batch, _MARK, True)
    return train_batch


def replace_set_loss_fn(orig, cls_name: str):
    """``<cls_name>.set_loss_fn(loss_fn, prepare_batch_fn=None)`` as the series shapes it (``TrainingWorker``, or
    ``ActorRolloutRefWorker``, whose actor keeps its mask), keeping ``orig``'s name and verl's ``@register``
    attributes; verl's own method while no pre-pass is set or passed."""

    series_method, actor = getattr(series, cls_name).set_loss_fn, cls_name == "ActorRolloutRefWorker"

    @functools.wraps(orig)
    def set_loss_fn(self, loss_fn, prepare_batch_fn=None):
        holder = self.actor if actor else self
        if prepare_batch_fn is None and "prepare_batch_fn" not in holder.__dict__:
            return orig(self, loss_fn)
        record_acted(f"{_PREFIX}{cls_name}.set_loss_fn")
        return series_method(self, loss_fn, prepare_batch_fn=prepare_batch_fn)

    setattr(set_loss_fn, _MARK, True)
    return set_loss_fn


def wrap_init_model(orig, verl_ppo_loss):
    """``ActorRolloutRefWorker.init_model`` (``orig``): after verl's body, the masked loss and the mask pre-pass, built
    on the actor config verl bound to ``verl_ppo_loss`` (``engine_workers.ppo_loss``). Raises
    TokenMaskIntegrationError for a token mask with another loss (distillation's ``distillation_ppo_loss``)."""

    @functools.wraps(orig)
    def init_model(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        actor, loss_fn = self.__dict__.get("actor"), self.__dict__.get("loss_fn")
        policy_loss = self.config.actor.get("policy_loss", None)
        if actor is None or policy_loss is None or not asks_for_mask(policy_loss):
            return out
        record_acted(_PREFIX + "ActorRolloutRefWorker.init_model")
        if getattr(loss_fn, "func", None) is not verl_ppo_loss:
            raise TokenMaskIntegrationError(
                f"actor.policy_loss.token_mask={policy_loss.get('token_mask')!r} is set, but the actor's loss is "
                f"{getattr(loss_fn, 'func', loss_fn)!r}, not verl's ppo_loss (distillation?): the mask would not "
                "be applied"
            )
        config = loss_fn.keywords["config"]  # verl's ActorConfig, with its model_config
        self.loss_fn = functools.partial(core_losses.ppo_loss, config=config)
        actor.set_loss_fn(self.loss_fn)
        if asks_for_extras(config.policy_loss):
            from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch

            actor.policy_token_mask_fn = StapoPrepareBatch.for_worker(config, actor)
        else:
            actor.policy_token_mask_fn = functools.partial(core_losses.apply_policy_token_mask, config)
        return out

    setattr(init_model, _MARK, True)
    return init_model


def patch_engine_workers(module) -> None:
    """Post-import hook of ``verl.workers.engine_workers``: install the dispatchers above (idempotent)."""
    cls, arr = module.TrainingWorker, module.ActorRolloutRefWorker
    for owner, name, make in ((cls, "train_batch", wrap_train_batch),
                              (cls, "set_loss_fn", lambda orig: replace_set_loss_fn(orig, "TrainingWorker")),
                              (arr, "set_loss_fn", lambda orig: replace_set_loss_fn(orig, "ActorRolloutRefWorker")),
                              (arr, "init_model", lambda orig: wrap_init_model(orig, module.ppo_loss))):
        if not getattr(getattr(owner, name), _MARK, False):
            setattr(owner, name, make(getattr(owner, name)))

