"""Driver-side patches of verl's v1 trainer: ``PPOTrainer._update_actor``, ``_save_checkpoint``, ``_load_checkpoint``
(ledger: :data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

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

``_save_checkpoint`` / ``_load_checkpoint`` keep that driver state (the collapse windows) in verl's checkpoint folder
(:data:`STATE_FILE`), so a resumed run continues the uninterrupted one.

Installed only in the processes of a job that asks for the diagnostics (:data:`.job.OPT_INS_ENV`), and acting only
when the trainer's job asks for them (``mask_statistics`` or ``dump_tokens``; :func:`.job.request_of`, decided
once per trainer from its config); for any other job each wrapper hands verl's method its own arguments and returns
its result untouched.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os

from stapo_verl.diagnostics.shipping import REQUEST_KEY, take_payloads
from stapo_verl.integration.verl_0_9_1.job import record_acted, request_of

_MARK = "__stapo_integration__"
_STATE = "_stapo_diagnostics"
_PREFIX = "verl.trainer.ppo.v1.trainer_base.PPOTrainer."


def _diagnostics_of(trainer):
    """The trainer's :class:`DriverDiagnostics` (built on first use), or None when the run does not use the plugin."""
    if not request_of(trainer, trainer.config).diagnostics:
        return None
    if _STATE not in trainer.__dict__:
        from verl.utils.config import omega_conf_to_dataclass

        from stapo_verl.diagnostics.driver import DriverDiagnostics

        pl = trainer.config.actor_rollout_ref.actor.policy_loss
        trainer.__dict__[_STATE] = DriverDiagnostics.from_policy_loss(omega_conf_to_dataclass(pl))
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
        record_acted(_PREFIX + "_update_actor")
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


#: the driver state's file inside verl's ``global_step_<n>`` checkpoint folder
STATE_FILE = "stapo_driver_state.json"


def _step_folder(trainer) -> str:
    """``<trainer.default_local_dir>/global_step_<global_steps>``, the folder verl saves to and resumes from
    (relative to the working directory, as ``PPOTrainer._load_checkpoint`` resolves it)."""
    folder = trainer.config.trainer.default_local_dir
    if not os.path.isabs(folder):
        folder = os.path.join(os.getcwd(), folder)
    return os.path.join(folder, f"global_step_{int(trainer.global_steps)}")


def wrap_save_checkpoint(orig):
    """``PPOTrainer._save_checkpoint`` replacement: write the diagnostics' driver state into the step folder first.

    First, so that verl's ``latest_checkpointed_iteration.txt``, written last by the body, never points at a folder
    without it; atomically (temporary file, then ``os.replace``).
    """

    @functools.wraps(orig)
    def _save_checkpoint(self):
        diagnostics = _diagnostics_of(self)
        if diagnostics is None:
            return orig(self)
        record_acted(_PREFIX + "_save_checkpoint")
        folder = _step_folder(self)
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(diagnostics.state_dict(), f)
        os.replace(tmp, os.path.join(folder, STATE_FILE))
        return orig(self)

    setattr(_save_checkpoint, _MARK, True)
    return _save_checkpoint


def wrap_load_checkpoint(orig):
    """``PPOTrainer._load_checkpoint`` replacement: after verl resumed at ``global_steps`` > 0, restore the driver
    state saved with that checkpoint (``resume_mode=resume_path`` reads ``trainer.resume_from_path``).

    A checkpoint without the file (written without the plugin) starts the windows empty and says so on the console.
    """

    @functools.wraps(orig)
    def _load_checkpoint(self):
        diagnostics = _diagnostics_of(self)
        if diagnostics is None:
            return orig(self)
        out = orig(self)
        record_acted(_PREFIX + "_load_checkpoint")
        if int(self.global_steps) == 0:
            return out
        folder = (self.config.trainer.resume_from_path if self.config.trainer.resume_mode == "resume_path"
                  else _step_folder(self))
        path = os.path.join(folder, STATE_FILE)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                diagnostics.load_state_dict(json.load(f))
        else:
            print(f"[stapo] {path} not found (checkpoint written without stapo-verl): the collapse early-warning "
                  "starts with empty windows", flush=True)
        return out

    setattr(_load_checkpoint, _MARK, True)
    return _load_checkpoint


def patch_trainer_base(module) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.trainer_base``: wrap ``PPOTrainer._update_actor``,
    ``_save_checkpoint`` and ``_load_checkpoint`` (idempotent)."""
    cls = module.PPOTrainer
    if not getattr(cls._update_actor, _MARK, False):
        cls._update_actor = wrap_update_actor(cls._update_actor)
    if not getattr(cls._save_checkpoint, _MARK, False):
        cls._save_checkpoint = wrap_save_checkpoint(cls._save_checkpoint)
    if not getattr(cls._load_checkpoint, _MARK, False):
        cls._load_checkpoint = wrap_load_checkpoint(cls._load_checkpoint)
