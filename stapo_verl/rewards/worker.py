"""Code that runs inside the reward worker processes of :class:`stapo_verl.rewards.timeout.KillableRunner`.

The fork server imports :mod:`stapo_verl.rewards.warm` once (``set_forkserver_preload``), which runs
:func:`warm_up` (imports math-verify and sympy, runs one parse), so every worker forked from it starts warm. A
failure is recorded, not raised (the fork server ignores preload errors); :func:`initialize` tries again in the
worker and keeps the error, which :func:`call` then raises as :class:`~stapo_verl.rewards.timeout.WorkerStartError`
on every call: the caller learns why, instead of getting wrong answers. Importing this module itself is cheap (the
trainer process imports it to reference :func:`initialize` and :func:`call`).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["call", "initialize", "warm_up"]

#: ``"ExcType: message"`` plus traceback of a failed warm-up in this process, else None.
WARM_UP_ERROR: str | None = None
_WARM = False


def warm_up() -> None:
    """Import the scorers and run one parse, so that the first scored answer does not pay for it.

    Never raises: a failure is kept in :data:`WARM_UP_ERROR`.
    """
    global WARM_UP_ERROR, _WARM
    if _WARM:
        return
    try:
        from stapo_verl.rewards import equivalence
        from stapo_verl.rewards.routing import score_response  # noqa: F401 - imported to be warm

        equivalence.answers_equivalent("\\frac{1}{2}", "0.5")
        WARM_UP_ERROR = None
        _WARM = True
    except BaseException as exc:  # noqa: BLE001 - reported to every caller by call()
        WARM_UP_ERROR = "".join(traceback.format_exception_only(type(exc), exc)).strip() + "\n" + "".join(
            traceback.format_tb(exc.__traceback__)[-3:])


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


def _limit_memory() -> None:
    """Cap the address space at ``STAPO_REWARD_WORKER_MEM_MB`` (default 8192; 0 = no cap).

    Raises:
        ValueError: the variable is not an integer.
    """
    raw = os.environ.get("STAPO_REWARD_WORKER_MEM_MB", "8192")
    try:
        mem_mb = int(raw)
    except ValueError as exc:
        raise ValueError(f"STAPO_REWARD_WORKER_MEM_MB={raw!r} must be an integer (MiB; 0 = no cap)") from exc
    if mem_mb > 0:
        import resource

        limit = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def initialize() -> None:
    """pebble's ``initializer`` of every worker: default ``SIGTERM`` (immediate kill), die with the fork server
    (which exits with the trainer), memory cap, warm-up. Never raises; a failure is reported by :func:`call`."""
    global WARM_UP_ERROR
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _release_fork_server()
    _die_with_parent()
    try:
        _limit_memory()
    except BaseException as exc:  # noqa: BLE001
        WARM_UP_ERROR = f"{type(exc).__name__}: {exc}"
        return
    warm_up()


def call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Run one call in the worker.

    Raises:
        WorkerStartError: the warm-up failed in this worker (the message carries its exception and traceback).
        Exception: whatever ``fn`` raises.
    """
    if WARM_UP_ERROR is not None:
        from stapo_verl.rewards.timeout import WorkerStartError

        raise WorkerStartError(f"reward worker could not import the scorers: {WARM_UP_ERROR}")
    return fn(*args, **kwargs)
