"""Would ``python -m verl.trainer.main_ppo <overrides>`` train anything, or resume at its last step and stop?

:func:`resume_state` reads it from the config Hydra composed (:func:`stapo_verl.launch.compose.compose_config`), so
``++trainer.total_training_steps=22``, ``trainer.default_local_dir=...``, ``trainer.resume_mode=disable`` or an
interpolation mean what they mean to verl; nothing here parses an override. Used by :mod:`stapo_verl.launch.train`.

verl's rule (``verl.trainer.ppo.v1.trainer_base`` ``_load_checkpoint`` and ``fit``): with ``resume_mode=auto`` the
trainer resumes from ``find_latest_ckpt_path(default_local_dir)`` (``resume_path``: from ``resume_from_path``), sets
``global_steps`` to that folder's step and trains while ``global_steps + 1 <= total_training_steps``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PREFIX = "[stapo recipe]"


@dataclass(frozen=True)
class ResumeState:
    """Where a run would start and end.

    Attributes:
        checkpoint_step: the global step verl resumes from (None: it trains from scratch).
        checkpoint_dir: the ``global_step_<n>`` folder it resumes from (None with no checkpoint).
        total_steps: the step verl's loop stops after (``trainer.total_training_steps``, or
            ``total_epochs × ⌊train rows / train_batch_size⌋`` when that is null; None when the rows are unknown).
        save_dir: ``trainer.default_local_dir``, absolute: where this invocation saves its checkpoints.
    """

    checkpoint_step: int | None
    checkpoint_dir: str | None
    total_steps: int | None
    save_dir: str | None = None

    @property
    def complete(self) -> bool:
        """True when verl would load the checkpoint and train no step."""
        return None not in (self.checkpoint_step, self.total_steps) and self.checkpoint_step >= self.total_steps


def _absolute(path: str) -> str:
    # verl joins a relative checkpoint path with the working directory
    return path if os.path.isabs(path) else os.path.join(os.getcwd(), path)


def resume_state(config) -> ResumeState:
    """The :class:`ResumeState` of a composed trainer config (the checkpoint folder is read, nothing else).

    Args:
        config: verl's trainer config (``DictConfig``), e.g. from :func:`stapo_verl.launch.compose.compose_config`.

    Raises:
        ValueError: ``trainer.resume_mode`` is not ``auto``, ``disable`` or ``resume_path``, or ``resume_path``
            without a ``global_step_<n>`` folder in ``trainer.resume_from_path`` (verl asserts the same).
    """
    from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, get_checkpoint_tracker_filename

    from stapo_verl.launch.compose import train_rows

    tr = config.trainer
    mode = tr.resume_mode
    folder = None
    if mode == "auto":
        base = _absolute(str(tr.default_local_dir))
        # find_latest_ckpt_path prints a line when the tracker file is missing: look first
        if os.path.exists(get_checkpoint_tracker_filename(base)):
            folder = find_latest_ckpt_path(base)
    elif mode == "resume_path":
        path = tr.get("resume_from_path")
        if not isinstance(path, str) or "global_step_" not in path:
            raise ValueError(f"trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N> "
                             f"(got {path!r})")
        folder = _absolute(path)
    elif mode != "disable":
        raise ValueError(f"trainer.resume_mode={mode!r}: allowed auto, disable, resume_path")
    step = int(str(folder).split("global_step_")[-1]) if folder else None
    total = tr.total_training_steps
    if total is None:
        rows, _ = train_rows(config)
        total = None if rows is None else int(tr.total_epochs) * (rows // int(config.data.train_batch_size))
    return ResumeState(step, folder, None if total is None else int(total), _absolute(str(tr.default_local_dir)))


def remove_incomplete_checkpoints(save_dir: str) -> tuple[int | None, list[str]]:
    """Delete the ``global_step_<n>`` folders of ``save_dir`` that verl's tracker file does not vouch for.

    verl writes ``latest_checkpointed_iteration.txt`` last, after a checkpoint's every file
    (``verl.utils.checkpoint.checkpoint_manager``), so a folder of a later step than the tracker's is a save that a stop
    interrupted; verl would never load it, and it must not be mistaken for a checkpoint.

    Returns:
        ``(the tracker's step or None, the folders removed)``.
    """
    import re
    import shutil

    from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

    tracker = get_checkpoint_tracker_filename(save_dir)
    try:
        with open(tracker, encoding="utf-8") as f:
            last = int(f.read().strip())
    except (OSError, ValueError):
        last = None
    removed = []
    if os.path.isdir(save_dir):
        for name in sorted(os.listdir(save_dir)):
            m = re.fullmatch(r"global_step_(\d+)", name)
            if m and (last is None or int(m.group(1)) > last):
                shutil.rmtree(os.path.join(save_dir, name), ignore_errors=True)
                removed.append(os.path.join(save_dir, name))
    return last, removed


def stopped_message(signal_name: str, save_dir: str, last_step: int | None, command: str) -> str:
    """The one line the launcher prints when a signal stopped the run: where the last complete checkpoint is and that
    the same command resumes from it (or starts again, without one). ``command``: the launcher's ``--command``, for
    the tiny recipes the whole command with the run directory, the caller's recipe variables and the Hydra overrides
    (``stapo_cpu_command`` in ``recipes/common/cpu.sh``), so that it resumes when run literally."""
    if last_step is None:
        return (f"{PREFIX} stopped by {signal_name} before the first checkpoint (none in {save_dir}); the same command "
                f"starts the run again: {command}")
    return (f"{PREFIX} stopped by {signal_name}; the last complete checkpoint is "
            f"{os.path.join(save_dir, f'global_step_{last_step}')} (step {last_step}); the same command resumes from "
            f"it: {command}")


def complete_message(state: ResumeState, command: str, run_dir: str | None = None) -> str:
    """What the recipe prints when ``state.complete``: the facts and the two ways on (a new run, more steps)."""
    lines = [
        f"the checkpoint {state.checkpoint_dir} is at step {state.checkpoint_step} and this invocation trains "
        f"until step {state.total_steps} (trainer.total_training_steps), so verl would train nothing. Nothing was run.",
        f"  train this run on:  {command} trainer.total_training_steps={state.checkpoint_step + 10}",
    ]
    if run_dir:
        import re
        import shlex

        other = f"STAPO_RUN_DIR={shlex.quote(run_dir + '_2')}"
        again = (re.sub(r"STAPO_RUN_DIR=(?:\\.|\S)+", lambda _m: other, command, count=1) if "STAPO_RUN_DIR=" in command
                 else f"{other} {command}")
        lines.append(f"  start another run:  {again}   (or delete {run_dir})")
        lines.append(f"  its results:        {run_dir}/summary.md")
    return "\n".join(f"{PREFIX} {line}" for line in lines)
