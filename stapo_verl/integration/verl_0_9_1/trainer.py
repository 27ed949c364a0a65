"""Driver-side patch of verl's v1 trainer: ``PPOTrainer._update_actor`` (ledger:
:data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

verl 0.9.1's ``PPOTrainer._update_actor`` (``verl.trainer.ppo.v1.trainer_base``; inherited by the sync, colocated
async and separate async trainers) calls ``self.actor_rollout_wg.update_actor(batch)`` once, then passes the
output's ``metrics`` through ``rename_dict`` and ``reduce_metrics`` (which averages lists). The wrapper:

1. puts the diagnostics request (:data:`stapo_verl.diagnostics.shipping.REQUEST_KEY`: is a token table due?) into
   ``batch.extra_info``, which verl hands the workers as a non-tensor field of every mini-batch;
2. for the duration of the call, wraps the worker group's bound ``update_actor`` on the instance, so that the
   diagnostics payload is taken out of the output's metrics before ``reduce_metrics`` sees it;
3. afterwards writes the payload's histograms and token table through the trainer's ``Tracking`` (``self.logger``)
   and adds the collapse z-scores to the step's ``metrics`` (:class:`stapo_verl.diagnostics.driver.DriverDiagnostics`,
   kept on the trainer instance).

Only when the run uses the plugin (``loss_mode=stapo`` or a ``token_mask``); otherwise verl's method runs unchanged.
"""

from __future__ import annotations

import contextlib
import functools

from stapo_verl.diagnostics.shipping import REQUEST_KEY, take_payloads

_MARK = "__stapo_integration__"
_STATE = "_stapo_diagnostics"


def _diagnostics_of(trainer):
    """The trainer's :class:`DriverDiagnostics` (built on first use), or None when the run does not use the plugin."""
    if _STATE not in trainer.__dict__:
        from verl.utils.config import omega_conf_to_dataclass

        from stapo_verl.core.config import wants_plugin_config
        from stapo_verl.diagnostics.driver import DriverDiagnostics

        pl = trainer.config.actor_rollout_ref.actor.policy_loss
        trainer.__dict__[_STATE] = (DriverDiagnostics.from_policy_loss(omega_conf_to_dataclass(pl))
                                    if wants_plugin_config(pl) else None)
    return trainer.__dict__[_STATE]


@contextlib.contextmanager
def taking_payloads(worker_group, sink: list):
    """Within the block, ``worker_group.update_actor`` returns its output without the diagnostics payload, which it
    appends to ``sink`` instead (the worker group's bound method is restored afterwards)."""
    from verl.utils import tensordict_utils as tu

    bound = worker_group.update_actor
    on_instance = "update_actor" in vars(worker_group)

    def update_actor(*args, **kwargs):
        output = bound(*args, **kwargs)
        if output is not None and "metrics" in output.keys():
            metrics = tu.get(output, "metrics")
            sink.extend(take_payloads(metrics))
            tu.assign_non_tensor(output, metrics=metrics)
        return output

    worker_group.update_actor = update_actor
    try:
        yield sink
    finally:
        if on_instance:
            worker_group.update_actor = bound
        else:
            del worker_group.update_actor


def wrap_update_actor(orig):
    """The ``PPOTrainer._update_actor`` replacement (see the module docstring)."""

    @functools.wraps(orig)
    def _update_actor(self, batch, metrics):
        diagnostics = _diagnostics_of(self)
        if diagnostics is None:
            return orig(self, batch, metrics)
        step = int(self.global_steps)
        due = diagnostics.table_due(step, test_freq=int(self.config.trainer.test_freq),
                                    total_steps=int(self.total_training_steps))
        payloads = []
        batch.extra_info[REQUEST_KEY] = due
        try:
            with taking_payloads(self.actor_rollout_wg, payloads):
                out = orig(self, batch, metrics)
        finally:
            batch.extra_info.pop(REQUEST_KEY, None)
        diagnostics.after_update(getattr(self, "logger", None), step, metrics, payloads)
        return out

    setattr(_update_actor, _MARK, True)
    return _update_actor


def patch_trainer_base(module) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.trainer_base``: wrap ``PPOTrainer._update_actor`` (idempotent)."""
    cls = module.PPOTrainer
    if not getattr(cls._update_actor, _MARK, False):
        cls._update_actor = wrap_update_actor(cls._update_actor)
