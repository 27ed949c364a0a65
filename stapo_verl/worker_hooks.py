"""Worker-side plumbing: the S2T mask before the micro-batch loop, and entropy into the loss.

verl 0.9.1 (``verl/workers/engine_workers.py``) trains one optimizer mini-batch per
``TrainingWorker.train_batch(data)`` call, which hands ``data`` to ``engine.train_batch``; the FSDP and
Megatron engines then compute ``batch_num_tokens = Σ loss_mask`` (all-reduced over DP) *before* the
micro-batch loop and call ``loss_fn(model_output=..., data=..., dp_group=...)`` per micro-batch.
This module wraps ``TrainingWorker.train_batch`` (no verl file is edited) so that, only when the actor's
``policy_loss`` is a :class:`stapo_verl.config.StapoPolicyLossConfig`:

1. **old-policy route** (``stats_source=old_policy``, default): the keep mask K is computed from the
   mini-batch's ``old_log_probs`` and ``entropy`` (written to TransferQueue by the v1 trainer's
   ``_compute_old_log_prob`` with ``calculate_entropy=True``) and ``advantages``, with the candidate population
   gathered over the DP group, and written into ``loss_mask`` and ``response_mask``. The engine's token count is
   then Σ K: exact renormalisation on FSDP and Megatron, zero extra forward passes, no entropy in the update.
2. **current-policy routes** (``stats_source=current_micro_batch``, ``top_entropy``): ``self.loss_fn`` is
   wrapped by :func:`stapo_ppo_loss`, which hands the *detached* per-token entropy verl computed in the training
   forward (``actor.calculate_entropy=True``; vocab-parallel under Megatron TP, computed before verl's in-place
   log-prob op) to the loss through :data:`stapo_verl.state.LOSS_CONTEXT`.

Under Megatron the current-policy entropy is computed gradient-free before verl's in-place log-prob op
(:mod:`stapo_verl.megatron.entropy`). Wrappers are installed lazily when verl first imports
``verl.workers.engine_workers`` / the Megatron engine module (a post-import hook), so loading the plugin does
not import the worker stack (or megatron-core) in every process.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

import torch

from stapo_verl import state
from stapo_verl.config import StapoPolicyLossConfig, check_registered
from stapo_verl.s2t import S2T_LOSS_MODES, MaskStats, s2t_keep_mask

_TARGET_MODULE = "verl.workers.engine_workers"
_MEGATRON_MODULE = "verl.workers.engine.megatron.transformer_impl"
_REQUIRED_FIELDS = ("old_log_probs", "entropy", "advantages", "response_mask")


class StapoDataError(KeyError):
    """Raised when a mini-batch lacks a field the old-policy S2T route needs."""


def _padded(t: torch.Tensor) -> torch.Tensor:
    """Nested (jagged) response tensor → (bs, T_max) float32, zeros in padding."""
    t = t.detach()
    if t.is_nested:
        return t.to(torch.float32).to_padded_tensor(0.0)
    return t.to(torch.float32)


def _write_mask(data, key: str, keep: torch.Tensor) -> None:
    from verl.workers.utils.padding import response_to_nested

    old = data[key]
    if old.is_nested:
        data[key] = response_to_nested(keep.to(old.dtype), old)
    else:
        data[key] = keep.to(old.dtype)


def apply_s2t_to_minibatch(data, policy_loss: StapoPolicyLossConfig, dp_group=None) -> MaskStats:
    """Compute K for one optimizer mini-batch (this rank's share) and write it into the masks.

    Args:
        data: verl TensorDict of the mini-batch with ``old_log_probs``, ``entropy``, ``advantages`` (response
            layout, nested/jagged or (bs, T)) and ``response_mask`` (+ ``loss_mask`` if present, same layout).
        policy_loss: the STAPO config (``tau_p``, ``entropy_quantile``, ``loss_mode``, ``random_mask_seed``).
        dp_group: DP group whose ranks together hold the mini-batch (``engine.get_data_parallel_group()``).
    Returns:
        global :class:`MaskStats` of the mini-batch (identical on every DP rank).
    Raises:
        StapoDataError: a required field is missing (e.g. legacy trainer or bypass mode).
    Source: spec §10 A3 (default route), verl_notes §5 design B; ``verl/workers/utils/padding.py``.
    """
    keys = set(data.keys())
    missing = [k for k in _REQUIRED_FIELDS if k not in keys]
    if missing:
        raise StapoDataError(
            f"stats_source='old_policy' needs mini-batch fields {list(_REQUIRED_FIELDS)}; missing {missing}. "
            "They come from verl's v1 trainer old-log-prob pass (trainer.use_v1=True, "
            "algorithm.rollout_correction.bypass_mode=False). Otherwise use "
            "+actor_rollout_ref.actor.policy_loss.stats_source=current_micro_batch with "
            "actor_rollout_ref.actor.calculate_entropy=True."
        )
    state.MINIBATCH.mask_calls += 1
    keep, stats = s2t_keep_mask(
        _padded(data["old_log_probs"]),
        _padded(data["entropy"]),
        _padded(data["advantages"]),
        _padded(data["response_mask"]).bool(),
        tau_p=policy_loss.tau_p,
        q=policy_loss.entropy_quantile,
        mode=S2T_LOSS_MODES[policy_loss.loss_mode],
        group=dp_group,
        seed=policy_loss.random_mask_seed * 1_000_003 + state.MINIBATCH.mask_calls,
    )
    _write_mask(data, "response_mask", keep)
    if "loss_mask" in keys:
        _write_mask(data, "loss_mask", keep)
    return stats


def stapo_ppo_loss(model_output, data, dp_group=None, *, inner):
    """Wrap verl's ``ppo_loss`` partial: hand the detached entropy and the DP group to the STAPO loss.

    Args:
        model_output: engine output dict; ``entropy`` (nested, full sequence) present iff verl computed it.
        data: the micro-batch TensorDict. dp_group: DP group passed by the engine.
        inner: the worker's original loss function, ``partial(verl...ppo_loss, config=actor_config)``.
    Returns:
        whatever ``inner`` returns: (loss, metrics).
    Notes:
        When ``entropy_coeff == 0`` the entropy is removed from ``model_output`` before verl's ``ppo_loss``
        sees it, so no entropy term (and no entropy backward) enters the loss (bugs D19, D20).
    Source: ``verl/workers/utils/losses.py::ppo_loss``; ``no_padding_2_padding`` for the (bs, T) layout.
    """
    from verl.workers.utils.padding import no_padding_2_padding

    config = inner.keywords["config"]
    entropy = model_output.get("entropy", None)
    ent = None
    if entropy is not None:
        ent = no_padding_2_padding(entropy, data).detach().float()
        if float(getattr(config, "entropy_coeff", 0.0) or 0.0) == 0.0:
            model_output = {k: v for k, v in model_output.items() if k != "entropy"}
    token = state.LOSS_CONTEXT.set(state.LossContext(entropy=ent, dp_group=dp_group))
    try:
        return inner(model_output=model_output, data=data, dp_group=dp_group)
    finally:
        state.LOSS_CONTEXT.reset(token)


def _stapo_actor_config(worker):
    loss_fn = getattr(worker, "loss_fn", None)
    config = getattr(loss_fn, "keywords", {}).get("config") if loss_fn is not None else None
    pl = getattr(config, "policy_loss", None)
    return config if isinstance(pl, StapoPolicyLossConfig) else None


def wrap_train_batch(orig):
    """Return the ``TrainingWorker.train_batch`` replacement (see module docstring)."""

    @functools.wraps(orig)
    def train_batch(self, data):
        config = _stapo_actor_config(self)
        if config is None:
            return orig(self, data)
        pl = config.policy_loss
        check_registered(pl.loss_mode)  # worker-side self-check before every update
        dp_group = self.engine.get_data_parallel_group()
        stats = None
        old_policy = pl.loss_mode in S2T_LOSS_MODES and pl.stats_source == "old_policy"
        if old_policy:
            stats = apply_s2t_to_minibatch(data, pl, dp_group)
        state.MINIBATCH.start(stats, detached_entropy=not old_policy)
        inner = self.loss_fn
        self.loss_fn = functools.partial(stapo_ppo_loss, inner=inner)
        try:
            return orig(self, data)
        finally:
            self.loss_fn = inner
            state.MINIBATCH.end()

    train_batch.__stapo_wrapped__ = True
    return train_batch


def _patch_workers(module) -> None:
    cls = module.TrainingWorker
    if not getattr(cls.train_batch, "__stapo_wrapped__", False):
        cls.train_batch = wrap_train_batch(cls.train_batch)


def _patch_megatron(module) -> None:
    from stapo_verl.megatron.entropy import patch_megatron_engine

    patch_megatron_engine(module)


_PATCHES = {_TARGET_MODULE: _patch_workers, _MEGATRON_MODULE: _patch_megatron}


class _PostImportLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _PATCHES[module.__name__](module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PostImportLoader(spec.loader)
        return spec


def install() -> None:
    """Install the wrappers now for verl modules already imported, else when verl first imports them."""
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


def is_installed() -> bool:
    """True if ``TrainingWorker.train_batch`` is wrapped in this process (imports verl's worker module)."""
    mod = importlib.import_module(_TARGET_MODULE)
    return bool(getattr(mod.TrainingWorker.train_batch, "__stapo_wrapped__", False))
