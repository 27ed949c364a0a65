"""Launch ``verl.trainer.main_ppo`` for a run directory, unless verl would train nothing.

Usage (what ``recipes/common/cpu.sh`` runs for the tiny CPU run)::

    python -m stapo_verl.launch.train --run-dir RUN [--command "bash recipes/tiny_cpu_stapo.sh"]
        [--stop-tokens MODEL OUT] -- <hydra overrides...>

In one process, so verl and the plugin are imported once:

1. Hydra composes the overrides with verl's config (:func:`stapo_verl.launch.compose.compose_config`) and
   :func:`stapo_verl.launch.resume.resume_state` reads verl's resume rule from it. When the checkpoint verl would
   resume from is already at the last step, it says so and exits with :data:`EXIT_COMPLETE` (nothing written).
2. It prints the line :func:`stapo_verl.launch.console.training_header` (the console reads the step range from
   it), writes the stop-token generation config (``--stop-tokens``, :func:`stapo_verl.stop_tokens.
   write_generation_config`) and sets the run's earlier metrics aside (:func:`prepare_metrics`): verl's ``file``
   logger truncates ``RUN/metrics.jsonl``, so the rows of the steps the checkpoint holds wait in
   ``RUN/metrics.history.jsonl``; rows of steps after the checkpoint (an attempt killed before its next checkpoint)
   are dropped, because this invocation trains those steps again.
3. It calls ``verl.trainer.main_ppo.main()`` (or ``$STAPO_MAIN_PPO``, ``module:function``) with the overrides as
   its command line: Hydra parses them again, exactly as ``python -m verl.trainer.main_ppo <overrides>`` would.
4. When main_ppo returns or fails, ``RUN/metrics.jsonl`` becomes the whole run, one row per step
   (:func:`finish_metrics`). After a ``kill -9`` the next invocation does it (step 2 reads both files).

5. SIGINT or SIGTERM (Ctrl-C; Slurm at a time limit or preemption) stops the run (:func:`stop_on_signals`): Ray is
   shut down (its processes with it), the checkpoint folders a stop interrupted are removed, and one line says where
   the last complete checkpoint is and that the same command resumes (:func:`stapo_verl.launch.resume.
   stopped_message`); no traceback. The signal reaches Ray's own processes as well, and the launcher's Ray client
   may end on their going before it gets there; then the recipe runs ``--after-stop SIGNAL``, which does the same
   from the composed config.
6. When Ray's local node does not come up in time (:func:`ray_start_timed_out`: on a loaded machine the raylet can
   take longer than the fixed 30 s Ray gives it to register), nothing has been trained: the processes that attempt
   started are ended and main_ppo is started again, :data:`RAY_START_ATTEMPTS` times in all, with one line each.
7. Ray's workers get :data:`RAY_WORKER_REGISTER_TIMEOUT_S` to register instead of Ray's 60 s
   (:func:`ray_environment`): a worker Ray kills for a slow start leaves ``ray.init`` waiting forever.
8. Ray is shut down when main_ppo returns, fails or is stopped, and the ``/dev/shm`` entries the job's killed
   processes left behind are removed (:mod:`stapo_verl.launch.shm`).

Before step 1, :func:`checked_config` stops with one line naming the fix, and exit status
:data:`~stapo_verl.launch.errors.EXIT_CONFIG` (2), on a verl the plugin was not written for, overrides that do not
compose, an override of the wrong type (:mod:`stapo_verl.launch.override_types`), a config value the plugin
refuses (with its default and the override that fixes it) and bad data files
(columns, data sources, prompt lengths: :mod:`stapo_verl.launch.data_checks`).

Exit status: main_ppo's (0 = trained); :data:`EXIT_COMPLETE` = already complete, nothing run; 2 = nothing started:
the config, the data or the verl is wrong (the message names the key and the fix); 128 + the signal's number
(130 SIGINT, 143 SIGTERM) = stopped by it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import signal
import sys
import time
from collections.abc import MutableMapping

from stapo_verl.launch import shm
from stapo_verl.launch.console import training_header
from stapo_verl.launch.errors import EXIT_CONFIG
from stapo_verl.launch.resume import (
    PREFIX,
    complete_message,
    remove_incomplete_checkpoints,
    resume_state,
    stopped_message,
)

#: exit status when the run is already complete and nothing was run
EXIT_COMPLETE = 3
#: ``module:function`` called to train (a Hydra main reading ``sys.argv``); ``$STAPO_MAIN_PPO`` replaces it
#: (e.g. a recipe's own main_ppo, or a recorder in tests)
DEFAULT_ENTRY = "verl.trainer.main_ppo:main"
ENTRY_ENV = "STAPO_MAIN_PPO"


#: what Ray 2.x raises (a plain ``Exception``) when the raylet it started has not registered with the GCS within the
#: fixed 30 s of ``ray._private.node.Node.__init__`` (``raylet_start_wait_time_s = 30``, not configurable in Ray
#: 2.60): on 2 loaded cores it took longer. Upstream: https://github.com/ray-project/ray (the constant is local to
#: ``Node.__init__``); a Ray that makes it configurable lets the launcher set it instead of starting again.
RAY_START_TIMEOUT = "The current node timed out during startup"
#: main_ppo starts in all, when Ray's local node timed out during startup
RAY_START_ATTEMPTS = 3

#: Ray's raylet kills a worker process that has not registered within ``worker_register_timeout_seconds`` (60 s in
#: Ray 2.60; the raylet reads it from its environment as this variable). The driver of the node's first job gets its
#: registration reply only when the workers the raylet prestarted for that job have registered
#: (``WorkerPool::first_job_driver_wait_num_python_workers_``, ray/src/ray/raylet/worker_pool.h), so a worker killed
#: for being slow leaves ``ray.init`` waiting forever, with one raylet line, "Some workers of the worker process(…)
#: have not registered within the timeout" (https://github.com/ray-project/ray/issues/8890). On 2 starved cores (load
#: 25) a worker's start took longer than 60 s and a launch waited 75 minutes. The launcher starts Ray's local node
#: with :data:`RAY_WORKER_REGISTER_TIMEOUT_S` unless the variable is set; a cluster started with ``ray start`` reads
#: it from that command's environment. Upstream: nothing to replace; a Ray whose driver stops waiting for a killed
#: worker makes the longer limit unnecessary. Gate: ``ray._raylet.Config.worker_register_timeout_seconds()`` reads
#: the variable (tests/integration/launch/test_ray_worker_register.py).
RAY_WORKER_REGISTER_TIMEOUT_ENV = "RAY_worker_register_timeout_seconds"
#: seconds a Ray worker of a launch may take to register (Ray's default: 60)
RAY_WORKER_REGISTER_TIMEOUT_S = 600


#: the run's metrics (verl's `file` logger target in the recipes)
METRICS_FILE = "metrics.jsonl"
#: rows of the run's earlier invocations kept while verl's file logger (which truncates ``metrics.jsonl``) writes
HISTORY_FILE = "metrics.history.jsonl"


def _read_rows(path: str) -> list[dict]:
    """``{"step", "data"}`` rows of a metrics JSONL (a torn last line, left by a killed writer, is skipped)."""
    rows = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("data"), dict):
                    rows.append(row)
    return rows


def _by_step(rows: list[dict]) -> dict[int, dict]:
    """One merged ``data`` per step, later rows overriding earlier keys (a resumed run's validation at its first step
    joins that step's training row)."""
    out: dict[int, dict] = {}
    for row in rows:
        out.setdefault(row["step"], {}).update(row["data"])
    return out


def _write_rows(path: str, by_step: dict[int, dict]) -> None:
    """Write one row per step, in step order, atomically (temporary file, then ``os.replace``)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"step": step, "data": by_step[step]}) + "\n" for step in sorted(by_step))
    os.replace(tmp, path)


def prepare_metrics(run_dir: str, checkpoint_step: int) -> None:
    """Before verl starts: keep the rows of the steps the checkpoint holds, drop those it will train again.

    The run's rows so far are ``metrics.history.jsonl`` (left by an invocation that was killed) plus
    ``metrics.jsonl``; those up to ``checkpoint_step`` go to ``metrics.history.jsonl``; rows of later steps were
    written by an attempt that never reached its next checkpoint, and the resumed run writes them again. A fresh
    start (``checkpoint_step`` 0) keeps an earlier ``metrics.jsonl`` aside as ``metrics.<unix time>.jsonl``.
    """
    path, history = os.path.join(run_dir, METRICS_FILE), os.path.join(run_dir, HISTORY_FILE)
    if checkpoint_step <= 0:
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            os.replace(path, os.path.join(run_dir, f"metrics.{int(time.time())}.jsonl"))
        if os.path.isfile(history):
            os.remove(history)
        return
    rows = _by_step(_read_rows(history) + _read_rows(path))
    _write_rows(history, {step: data for step, data in rows.items() if step <= checkpoint_step})
    if os.path.isfile(path):
        os.remove(path)


def finish_metrics(run_dir: str) -> None:
    """After verl ends (or fails): ``metrics.jsonl`` = the kept history + this invocation's rows, one row per step."""
    path, history = os.path.join(run_dir, METRICS_FILE), os.path.join(run_dir, HISTORY_FILE)
    if not (os.path.isfile(history) or os.path.isfile(path)):
        return
    _write_rows(path, _by_step(_read_rows(history) + _read_rows(path)))
    if os.path.isfile(history):
        os.remove(history)


def checked_config(overrides: list[str], verl_problems: list[str] | None = None):
    """The composed config, or None after printing one error line (on stderr) for what would fail before training:
    a verl the plugin was not written for, overrides that do not compose, a value the config refuses, bad data
    (:mod:`stapo_verl.launch.errors`, :mod:`stapo_verl.launch.data_checks`).

    Args:
        overrides: the Hydra overrides.
        verl_problems: :func:`stapo_verl.launch.errors.installed_verl_problems` (computed when None).
    """
    from stapo_verl.integration.verl_0_9_1 import allowed_anyway
    from stapo_verl.launch import errors
    from stapo_verl.launch.compose import compose_config

    def fail(what: str, text: str) -> None:
        print(f"{PREFIX} ERROR: {what}: {text}", file=sys.stderr, flush=True)

    problems = errors.installed_verl_problems() if verl_problems is None else verl_problems
    gate = errors.verl_gate_message(problems, allowed_anyway())
    if gate:
        return fail("wrong verl", gate)
    renamed = errors.renamed_override(overrides)
    if renamed:
        return fail("invalid config", renamed)
    try:
        config = compose_config(overrides)
    except Exception as exc:  # noqa: BLE001  (Hydra / OmegaConf / ValueError: the message names the key)
        # one line (Hydra's messages span several: the reason and the "+key" hint would be hidden by the console)
        cause = f" (caused by {type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        return fail("the overrides do not compose", " ".join(f"{type(exc).__name__}: {exc}{cause}".split()))
    from stapo_verl.launch.override_types import OverrideTypeError, check_composed

    try:
        check_composed(overrides, config)
    except OverrideTypeError as exc:
        return fail("invalid config", str(exc))
    try:
        errors.validate_policy_loss(config)
    except Exception as exc:  # noqa: BLE001  (the plugin's StapoConfigError, verl's ValueError: one line)
        return fail("invalid config", errors.config_error_message(exc))
    from stapo_verl.launch.data_checks import DataCheckError, check_data
    from stapo_verl.launch.recipe_rules import local_model

    try:
        report = check_data(config, local_model(config))
    except (DataCheckError, OSError) as exc:
        return fail("bad data", " ".join(str(exc).split()))
    for line in report.warnings:
        print(f"{PREFIX} WARNING: {line}", file=sys.stderr, flush=True)
    return config


class StopRequested(BaseException):
    """Raised in the main thread by SIGINT or SIGTERM (a ``BaseException``, like ``KeyboardInterrupt``, so that no
    ``except Exception`` of verl or Hydra swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


@contextlib.contextmanager
def stop_on_signals():
    """While active, SIGINT and SIGTERM raise :class:`StopRequested` in the main thread (the first one; later ones
    are ignored while the run shuts down). The previous handlers come back on exit."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum, _frame):
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise StopRequested(signum)

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def ray_start_timed_out(exc: BaseException) -> bool:
    """True when ``exc`` is, or was raised while handling, Ray's local-node startup timeout (:data:`RAY_START_TIMEOUT`)
    and Ray is not initialized: main_ppo failed before anything was trained.

    ``@hydra.main`` turns a failed task into ``SystemExit(1)`` raised inside its ``except`` block
    (``hydra._internal.utils.run_and_report``), so the exception is the exit's ``__context__``; the chain is followed
    through ``__cause__`` and ``__context__``. Raises nothing.
    """
    import ray

    seen, chain = set(), [exc]
    while chain:
        e = chain.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e) is Exception and str(e).startswith(RAY_START_TIMEOUT):
            return not ray.is_initialized()
        chain += [e.__cause__, e.__context__]
    return False


def ray_environment(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Set in ``environ`` (the launcher's ``os.environ``, which the Ray node that main_ppo's ``ray.init`` starts
    inherits) the Ray settings of a launch that are not set already: :data:`RAY_WORKER_REGISTER_TIMEOUT_ENV` =
    :data:`RAY_WORKER_REGISTER_TIMEOUT_S`. Returns the ones it set. Raises nothing."""
    added = {}
    if not environ.get(RAY_WORKER_REGISTER_TIMEOUT_ENV):
        added[RAY_WORKER_REGISTER_TIMEOUT_ENV] = str(RAY_WORKER_REGISTER_TIMEOUT_S)
    environ.update(added)
    return added


def end_attempt_processes() -> list[int]:
    """Terminate this process's child processes (what a failed Ray start left: its GCS server and raylet, which no
    ``ray.shutdown`` reaches because ``ray.init`` never returned), then kill those still running after 10 s.
    Returns their pids. Raises nothing."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=10)
    return [c.pid for c in children]


def run_main_ppo(entry, save_dir: str, command: str, started: float) -> int:
    """Call ``entry`` (main_ppo's Hydra main) with SIGINT/SIGTERM as stops, starting it again after a Ray startup
    timeout (:func:`ray_start_timed_out`, :data:`RAY_START_ATTEMPTS` starts in all). Returns the exit status (0, or
    128 + the signal's number); re-raises main_ppo's other failures after :func:`end_ray`."""
    from hydra.core.global_hydra import GlobalHydra

    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            with stop_on_signals():
                entry()  # @hydra.main parses sys.argv, exits non-zero on error
            return 0
        except StopRequested as stop:
            return shut_down_after_stop(stop, save_dir, command, started)
        except BaseException as exc:
            timed_out = ray_start_timed_out(exc)
            ended = end_attempt_processes() if timed_out else []
            if attempt == RAY_START_ATTEMPTS or not timed_out:
                end_ray(started, "after main_ppo failed")
                raise
        GlobalHydra.instance().clear()  # the failed start left Hydra initialized in this process
        print(f"{PREFIX} Ray's local node did not register within Ray's fixed 30 s (a loaded machine); nothing was "
              f"trained: ended the {len(ended)} process(es) it started, starting again ({attempt + 1} of "
              f"{RAY_START_ATTEMPTS})", file=sys.stderr, flush=True)
    raise AssertionError("unreachable: the last attempt returns or raises")


def end_ray(started: float | None, why: str) -> None:
    """End Ray (this process started the local cluster, or is a client of one), then remove the ``/dev/shm`` entries
    the job's killed processes left (:func:`stapo_verl.launch.shm.remove_orphans`, entries created since ``started``,
    seconds since the epoch; None: none removed). Raises nothing: a failure is one line on stderr."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception as exc:  # noqa: BLE001  (the shutdown goes on: say it, once)
        print(f"{PREFIX} ray.shutdown {why} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if started is not None:
        removed = shm.remove_orphans(started)
        if removed:
            # housekeeping, for the log only (the console shows "[stapo ...]" lines, not this one)
            print(f"stapo-verl launcher: removed {len(removed)} shared-memory object(s) the job's killed processes "
                  f"left in {shm.SHM_DIR}: {' '.join(removed)}", file=sys.stderr, flush=True)


def shut_down_after_stop(stop: StopRequested, save_dir: str, command: str, started: float | None = None) -> int:
    """After :class:`StopRequested`: :func:`end_ray`, remove the checkpoint folders the stop interrupted, print
    :func:`stapo_verl.launch.resume.stopped_message`; returns the exit status, 128 + the signal's number.
    ``started``: when the run started (seconds since the epoch), for :func:`end_ray`."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    end_ray(started, "after the stop")
    last, _removed = remove_incomplete_checkpoints(save_dir)
    print(stopped_message(str(stop), save_dir, last, command), flush=True)
    return 128 + stop.signum


def main(argv: list[str] | None = None, verl_problems: list[str] | None = None) -> int:
    """CLI entry (see the module docstring); returns the exit status. ``verl_problems``: as
    :func:`checked_config`."""
    ap = argparse.ArgumentParser(prog="python -m stapo_verl.launch.train", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True, help="the run directory (metrics.jsonl lives there)")
    ap.add_argument("--command", default="python -m verl.trainer.main_ppo ...",
                    help="the command the user ran (for messages)")
    ap.add_argument("--stop-tokens", nargs=2, metavar=("MODEL", "OUT"), default=None,
                    help="write MODEL's generation config with every stop id into OUT first")
    ap.add_argument("--after-stop", choices=("SIGINT", "SIGTERM"), default=None,
                    help="the run was stopped by this signal before the launcher could say so (Ray's processes, "
                         "signalled with it, can end the launcher first): clean up and say where it resumes")
    ap.add_argument("--started-at", type=float, default=None,
                    help="with --after-stop: when the stopped run started (seconds since the epoch), so that the "
                         "shared-memory objects its killed processes left are removed")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, after --")
    a = ap.parse_args(argv)
    started = time.time()
    if a.after_stop:
        from stapo_verl.launch.compose import compose_config

        try:
            # after a stop, the one line is the stop's: verl's "Found checkpoint" print goes
            with contextlib.redirect_stdout(io.StringIO()):
                state = resume_state(compose_config(a.overrides))
        except Exception as exc:  # noqa: BLE001  (the run composed before it was stopped; say it, once)
            print(f"{PREFIX} ERROR: the overrides do not compose: {' '.join(str(exc).split())}", file=sys.stderr)
            return EXIT_CONFIG
        return shut_down_after_stop(StopRequested(getattr(signal, a.after_stop)), state.save_dir, a.command,
                                    a.started_at)
    config = checked_config(a.overrides, verl_problems)
    if config is None:
        return EXIT_CONFIG
    try:
        state = resume_state(config)
    except ValueError as exc:  # trainer.resume_mode / resume_from_path: nothing started, one line
        print(f"{PREFIX} ERROR: invalid config: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    if state.complete:
        print(complete_message(state, a.command, a.run_dir), file=sys.stderr, flush=True)
        return EXIT_COMPLETE
    print(training_header(a.run_dir, state.checkpoint_step or 0, state.total_steps), flush=True)
    if a.stop_tokens:
        from stapo_verl import stop_tokens

        model, out = a.stop_tokens
        stop = stop_tokens.write_generation_config(model, out)
        print(f"[stapo stop tokens] {model}: stop at {stop.describe()} -> {out}", flush=True)
    prepare_metrics(a.run_dir, state.checkpoint_step or 0)
    ray_environment(os.environ)
    sys.argv = ["verl.trainer.main_ppo", *a.overrides]
    module, _, function = os.environ.get(ENTRY_ENV, DEFAULT_ENTRY).partition(":")
    try:
        rc = run_main_ppo(getattr(importlib.import_module(module), function), state.save_dir, a.command, started)
    finally:
        finish_metrics(a.run_dir)
    if rc == 0:
        end_ray(started, "after training")
    return rc


if __name__ == "__main__":
    sys.exit(main())
