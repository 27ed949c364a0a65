"""Code that runs inside the reward worker processes of :class:`stapo_verl.rewards.timeout.KillableRunner`.

The fork server imports :mod:`stapo_verl.rewards.warm` once (``set_forkserver_preload``), which runs
:func:`warm_up` (imports math-verify and sympy, runs one parse), so every worker forked from it starts warm. Whether
a process is warm is not kept in a variable: it is whether :mod:`stapo_verl.rewards.warm` is imported in it
(``sys.modules``, inherited by every worker the fork server forks). A failed warm-up raises
:class:`ScorersUnavailable` (an ``ImportError``, which the fork server ignores) out of that import, so the module is
not imported; :func:`initialize` tries again in the worker, and :func:`call` imports it before every call (a
dictionary look-up once it is imported) and turns the failure into :class:`WorkerStartError`: the caller learns
why, instead of getting wrong answers.
Importing this module itself is cheap (the trainer process imports it to reference :func:`initialize` and
:func:`call`).
"""

from __future__ import annotations

import importlib
import multiprocessing.spawn
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["PRELOAD_MODULE", "ScorersUnavailable", "WorkerStartError", "call", "initialize",
           "keep_main_module_out_of_workers", "warm_up"]

#: Module imported once by the fork server, so that new workers start warm.
PRELOAD_MODULE = "stapo_verl.rewards.warm"


class WorkerStartError(RuntimeError):
    """A reward worker could not start (its warm-up import failed, or no worker took a call in time)."""

#: keys of multiprocessing's preparation data that re-run the parent's main module in a child
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


class ScorersUnavailable(ImportError):
    """The scorers cannot be imported or run in this process (the message is ``"ExcType: message"`` plus the
    last frames of its traceback). An ``ImportError`` so that the fork server's preload ignores it."""


def warm_up() -> None:
    """Import the scorers and run one parse, so that the first scored answer does not pay for it.

    Raises:
        ScorersUnavailable: the import or the parse failed (the message carries the exception and its traceback).
    """
    try:
        # the scorers stapo_verl.rewards.routing.score_response dispatches to (routing itself, a few dictionaries,
        # is imported by the first call: importing it here would close the loop routing -> timeout -> worker)
        from stapo_verl.rewards import dapo, equivalence, math_verify_scorer  # noqa: F401 - imported to be warm

        equivalence.answers_equivalent("\\frac{1}{2}", "0.5")
    except BaseException as exc:  # noqa: BLE001 - reported to every caller by call()
        raise ScorersUnavailable(
            "".join(traceback.format_exception_only(type(exc), exc)).strip() + "\n"
            + "".join(traceback.format_tb(exc.__traceback__)[-3:])) from None


def keep_main_module_out_of_workers() -> None:
    """In the fork server: prepare pebble's workers without re-running the caller's main module (idempotent).

    For every child, multiprocessing re-runs the parent's ``__main__`` (``multiprocessing.spawn.prepare``:
    ``init_main_from_path`` / ``init_main_from_name``), which executes the top level of a script without a main
    guard in each worker, and imports ``verl.trainer.main_ppo`` (torch, about 5 s) into each worker when that is
    the main module. The reward workers run only functions of ``stapo_verl`` and pebble, so for pebble's workers
    (process name ``pebble.pool.process.WORKERS_NAME``) ``prepare`` runs without those two keys; any other process
    forked from the server is prepared as usual. ``multiprocessing.spawn.prepare`` is replaced in the process that
    calls this (the fork server, which imports :mod:`stapo_verl.rewards.warm`), never in the trainer: the original
    is kept by the replacement, and a replacement already in place (marked ``_stapo_keeps_main_out``) is kept.
    """
    from pebble.pool.process import WORKERS_NAME

    original = multiprocessing.spawn.prepare
    if getattr(original, "_stapo_keeps_main_out", False):
        return

    def prepare(data: dict) -> None:
        """``multiprocessing.spawn.prepare`` without the main-module step for pebble's workers."""
        if data.get("name") == WORKERS_NAME:
            data = {k: v for k, v in data.items() if k not in _MAIN_KEYS}
        original(data)

    prepare._stapo_keeps_main_out = True
    multiprocessing.spawn.prepare = prepare


def _release_fork_server() -> None:
    """Close this worker's copy of the fork server's "alive" pipe.

    multiprocessing hands every child of the fork server the write end of the pipe on which the server waits for
    EOF to exit (``multiprocessing.forkserver``: ``_forkserver_alive_fd``, passed so that a child could use the
    server itself). While a hung worker holds it, the server would outlive a SIGKILLed trainer, and so would the
    worker. The workers never start processes, so they close it; then the server exits with the trainer and
    ``PR_SET_PDEATHSIG`` takes the workers with it.
    """
    from multiprocessing import forkserver

    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None


def _die_with_parent() -> None:
    """``PR_SET_PDEATHSIG(SIGKILL)``: die when the parent (the fork server) dies; Linux only, best effort."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the parent died before the signal was armed
        os._exit(0)


def _memory_cap_mb() -> int:
    """``STAPO_REWARD_WORKER_MEM_MB`` (default 8192; 0 = no cap).

    Raises:
        ValueError: the variable is not an integer.
    """
    raw = os.environ.get("STAPO_REWARD_WORKER_MEM_MB", "8192")
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"STAPO_REWARD_WORKER_MEM_MB={raw!r} must be an integer (MiB; 0 = no cap)") from exc


def _limit_memory() -> None:
    """Cap the address space at ``STAPO_REWARD_WORKER_MEM_MB`` MiB.

    Raises:
        ValueError: the variable is not an integer.
    """
    mem_mb = _memory_cap_mb()
    if mem_mb > 0:
        import resource

        limit = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def initialize() -> None:
    """pebble's ``initializer`` of every worker: default ``SIGTERM`` (immediate kill), die with the fork server
    (which exits with the trainer), memory cap, warm-up (a no-op where the fork server warmed up). Never raises; a
    failure is reported by :func:`call`."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _release_fork_server()
    _die_with_parent()
    try:
        _limit_memory()
    except ValueError:
        return  # call() reports it
    try:
        importlib.import_module(PRELOAD_MODULE)
    except BaseException:  # noqa: BLE001 - call() reports it
        return


def call(fn: Callable[..., Any], args: tuple, kwargs: dict, cpu_limit_s: float | None = None) -> Any:
    """Run one call in the worker, with at most ``cpu_limit_s`` seconds of this process's CPU time (None: no limit).

    The limit is an ``ITIMER_PROF`` timer (user + system CPU time, counted only while this process runs) with
    ``SIGPROF``'s default action, which ends the process even inside a long C call; the runner reports that death as
    a timeout. CPU time, unlike wall-clock time, does not grow when the machine is busy, so whether an answer is cut
    off depends on the answer, not on the load beside it.

    Raises:
        WorkerStartError: the memory cap is not an integer, or the warm-up (the import of
            :mod:`stapo_verl.rewards.warm`) fails in this worker (the message carries its exception and traceback).
        Exception: whatever ``fn`` raises.
    """
    try:
        _memory_cap_mb()
        importlib.import_module(PRELOAD_MODULE)  # a dictionary look-up once this process is warm
    except BaseException as exc:  # noqa: BLE001 - whatever stops the warm-up is the caller's error, not an answer
        reason = str(exc) if isinstance(exc, ScorersUnavailable) else f"{type(exc).__name__}: {exc}"
        raise WorkerStartError(f"reward worker could not import the scorers: {reason}") from None
    if cpu_limit_s is None:
        return fn(*args, **kwargs)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_PROF, cpu_limit_s)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
