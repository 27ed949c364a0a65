"""Hard per-call timeouts for reward scoring: a ``pebble.ProcessPool`` of killable worker processes.

Why: a degenerate answer can make math-verify/sympy (or the regexes of verl's ``normalize_final_answer``) run for
minutes: ``\\boxed{5^{5^{5^{5^{5}}}}}`` makes ``math_verify.verify`` evaluate a power tower
(https://github.com/huggingface/Math-Verify/issues/65). ``signal.alarm`` does not work in verl's reward threads, and
a thread cannot be killed. Each call therefore runs in a worker process of a pebble ``ProcessPool``
(https://pebble.readthedocs.io/): on timeout pebble kills that worker and starts a replacement, so a hung parser
neither blocks training nor leaks a process.

What is project-specific (everything else is pebble's and the standard library's):

* **Warm workers.** Workers are forked from multiprocessing's fork server (``forkserver`` start method), which
  imports :mod:`stapo_verl.rewards.warm` once (``set_forkserver_preload``: math-verify, sympy and a first parse);
  a replacement after a kill starts ready to score in milliseconds. Forking from the single-threaded fork server
  (not from verl's multi-threaded reward process) is what makes forking safe. The workers do not re-run the
  caller's main module (multiprocessing's default for this start method; see :mod:`stapo_verl.rewards.warm`), so
  scripts without a main guard work and ``verl.trainer.main_ppo`` is not imported into each worker.
* **The initializer** (:func:`stapo_verl.rewards.worker.initialize`): ``SIGTERM`` gets its default action back, so
  the kill is immediate even inside a long C call (pebble's own handler would wait for the call to return, then
  SIGKILL after 3 s); ``PR_SET_PDEATHSIG`` (Linux) makes a worker die with the fork server, which exits when this
  process dies, so a hung worker does not outlive a SIGKILLed trainer; ``RLIMIT_AS`` (env
  ``STAPO_REWARD_WORKER_MEM_MB``, default 8192) turns a runaway big-integer computation into ``MemoryError``. A
  worker whose warm-up import fails stays up and answers every call with :class:`WorkerStartError`, which
  :meth:`KillableRunner.run` raises: a broken environment is an error, never a wrong answer.
* **Bounded concurrency.** At most ``max_workers`` calls are in flight (verl calls ``compute_score`` from a thread
  pool; further calls wait), so a call's timeout starts when a worker takes it, and the time to start a
  replacement worker is never charged to a call.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from stapo_verl.rewards.worker import PRELOAD_MODULE, WorkerStartError, call, initialize

logger = logging.getLogger(__name__)

#: Default hard timeout per scored sample, in seconds of the worker's CPU time (env ``STAPO_REWARD_TIMEOUT_S``
#: overrides).
DEFAULT_TIMEOUT_S = 5.0
#: The wall-clock backstop of a call whose CPU time is limited to ``timeout_s`` (a hang that uses no CPU, e.g. a
#: blocking read): ``WALL_FACTOR * timeout_s + WALL_SLACK_S`` seconds, so a call that stays within its CPU time is not
#: cut off unless the worker gets under a tenth of a core.
WALL_FACTOR, WALL_SLACK_S = 10.0, 30.0
#: How long a call may wait for a worker to take it (a worker that cannot start is an error, not a timeout).
DEFAULT_START_TIMEOUT_S = 120.0


@dataclasses.dataclass
class CallResult:
    """Outcome of one :meth:`KillableRunner.run` call.

    Attributes:
        value: the function's return value (``None`` on timeout or error).
        timed_out: True when the call exceeded its timeout and its worker was killed.
        error: ``"ExcType: message"`` when the function raised or its worker died, else ``None``.
        elapsed_s: wall-clock seconds spent in :meth:`KillableRunner.run`.
    """

    value: Any
    timed_out: bool
    error: str | None
    elapsed_s: float


def _forkserver_context():
    """multiprocessing's ``forkserver`` context with :data:`PRELOAD_MODULE` preloaded.

    The preload list is process-wide and takes effect when the fork server starts (on the first pool).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD_MODULE])
    return ctx


def _kill_fork_server() -> None:
    """SIGKILL multiprocessing's fork server of this process (best effort; ``_forkserver_pid`` is its record)."""
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def _tracker_died() -> bool:
    """True when this process started multiprocessing's resource tracker and it is no longer running.

    The tracker is normally this process's child (``multiprocessing.resource_tracker``: ``_resource_tracker._pid``, a
    private attribute read here and nowhere written), so ``waitpid(WNOHANG)`` tells whether it ended (a killed child
    stays a zombie until reaped, and this reaps it). A tracker that is not our child (inherited through ``os.fork``,
    or already reaped) counts as dead only when no process has its pid."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    if not pid:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, not ours to signal
        return False
    return False


def _no_unregister_after_tracker_death() -> None:
    """At exit of the process that owns the pool: if its resource tracker was killed, unregistering is a no-op.

    Why: the pool's locks are named semaphores, registered with this process's resource tracker and unregistered by
    their finalizers at exit (``multiprocessing.synchronize.SemLock._cleanup``: ``sem_unlink``, then
    ``resource_tracker.unregister``). Ray kills a worker's child processes, the tracker among them, and a worker
    that then exits normally runs those finalizers: ``unregister`` finds the tracker dead, starts a new one
    ("resource_tracker: process died unexpectedly, relaunching") and sends it names it never registered, which it
    reports as ``KeyError: '/mp-…'`` tracebacks on the job's console. The semaphores are unlinked either way (the
    finalizer unlinks before it unregisters); what died with the tracker was only its list of names, so there is
    nothing left to unregister. Registered with :mod:`atexit` when a pool starts, after ``multiprocessing.util``'s
    own exit handler, so it runs first. Upstream: CPython's relaunched tracker could ignore an unknown name on
    UNREGISTER (https://github.com/python/cpython/issues/82300 is the wider problem of the tracker's names).
    """
    from multiprocessing import resource_tracker

    try:
        dead = _tracker_died()
    except Exception:  # noqa: BLE001  (an exit hook must not print a traceback of its own)
        return
    if dead:
        resource_tracker.unregister = lambda name, rtype: None  # this process is exiting: see above


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from exc


class KillableRunner:
    """Run picklable module-level functions in killable worker processes with a hard per-call timeout.

    Args:
        timeout_s: default per-call timeout in seconds of the worker's CPU time (> 0), with a wall-clock backstop
            of ``WALL_FACTOR * timeout_s + WALL_SLACK_S``.
        max_workers: worker processes and most concurrent calls; default ``min(4, os.cpu_count())`` (env
            ``STAPO_REWARD_WORKERS`` overrides).
        start_timeout_s: how long a call may wait for a worker to take it before :class:`WorkerStartError`.

    Counters ``calls``, ``timeouts`` and ``errors`` are kept in :attr:`stats`. Thread-safe. After ``os.fork()`` the
    child process starts its own pool on its first call.

    Raises:
        ValueError: ``timeout_s <= 0``, ``max_workers < 1`` or ``start_timeout_s <= 0``.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_workers is None:
            max_workers = _env_int("STAPO_REWARD_WORKERS", min(4, os.cpu_count() or 1))
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        if not start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.max_workers = int(max_workers)
        self.start_timeout_s = float(start_timeout_s)
        self._lock = threading.Lock()
        self._pool = None
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0}

    def _get_pool(self):
        with self._lock:
            if self._pid != os.getpid():  # inherited through os.fork(): the parent's pool is not ours
                self._pid, self._pool = os.getpid(), None
                self._slots = threading.BoundedSemaphore(self.max_workers)
            if self._pool is None or not self._pool.active:
                self._pool = self._start_pool()
            return self._pool, self._slots

    def _start_pool(self):
        """A new pool whose workers answered one call within ``start_timeout_s``.

        The first call starts the fork server, which imports the scorers (:mod:`stapo_verl.rewards.warm`); an import
        that hangs would block that call forever, so it is made from a helper thread and waited for with a limit.

        The multiprocessing and pebble sites of :mod:`stapo_verl.rewards.ledger` (the fork server's ``prepare``, the
        workers' alive pipe, the exit hook's ``unregister``) are checked first: they are applied in processes and at
        a time where a failure could not reach the caller.

        Raises:
            WorkerStartError: no worker answered in time (the fork server is then killed), or the warm-up failed.
            stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the installed Python or pebble differs from what
                the ledger was written for (unless ``STAPO_ALLOW_UNSUPPORTED_VERL=1``).
        """
        from pebble import ProcessPool

        from stapo_verl.rewards import ledger

        ledger.check(ledger.POOL_PATCHES, ledger.POOL_WRITTEN_FOR)
        pool = ProcessPool(max_workers=self.max_workers, initializer=initialize, context=_forkserver_context())
        atexit.unregister(_no_unregister_after_tracker_death)  # once per process, after multiprocessing's own
        atexit.register(_no_unregister_after_tracker_death)
        box: dict[str, Any] = {}

        def ping() -> None:
            try:
                box["pid"] = pool.schedule(call, args=(os.getpid, (), {})).result()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = exc

        thread = threading.Thread(target=ping, name="stapo-reward-pool-start", daemon=True)
        thread.start()
        thread.join(self.start_timeout_s)
        if thread.is_alive():
            _kill_fork_server()  # unblocks pebble's threads, which wait for the server
            pool.stop()
            raise WorkerStartError(
                f"reward workers did not start within start_timeout_s={self.start_timeout_s} s (the fork server's "
                f"import of {PRELOAD_MODULE} or a worker's warm-up hangs; it was killed)")
        if "error" in box:
            pool.stop()
            pool.join()
            if isinstance(box["error"], WorkerStartError):
                raise box["error"]
            raise WorkerStartError(f"reward workers failed to start: {box['error']!r}") from box["error"]
        return pool

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> CallResult:
        """Call ``fn(*args, **kwargs)`` in a worker; kill the worker when the call uses more than ``timeout_s`` seconds
        of CPU time (or runs ``WALL_FACTOR * timeout_s + WALL_SLACK_S`` seconds of wall-clock time).

        Args:
            fn: a module-level (picklable) function; its arguments and result must be picklable.
            timeout_s: this call's timeout (> 0; default: the runner's).

        Returns:
            A :class:`CallResult`; failures inside ``fn`` (and a worker that died, e.g. of ``MemoryError``) come
            back in ``error``.

        Raises:
            ValueError: ``timeout_s <= 0``.
            WorkerStartError: the worker's warm-up import failed (the message carries its exception), or no worker
                took the call within ``start_timeout_s``.
            stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the pool's sites differ from what the reward
                code's ledger was written for (checked when a pool starts).
        """
        from concurrent.futures.process import BrokenProcessPool

        from pebble import ProcessExpired

        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        t0 = time.perf_counter()
        pool, slots = self._get_pool()
        with slots:
            self._count("calls")
            future = pool.schedule(call, args=(fn, args, kwargs, timeout), timeout=WALL_FACTOR * timeout + WALL_SLACK_S)
            done, _ = concurrent.futures.wait([future], timeout=self.start_timeout_s)
            if not done and not future.running() and future.cancel():  # no worker took it in time
                raise WorkerStartError(
                    f"no reward worker took the call within start_timeout_s={self.start_timeout_s} s "
                    "(a worker's start hangs; its stderr is this process's stderr)")
            try:
                value = future.result()  # pebble: the wall-clock backstop, from when a worker took it
            except concurrent.futures.TimeoutError:
                self._count("timeouts")
                return CallResult(None, True, None, time.perf_counter() - t0)
            except WorkerStartError:
                raise
            except BrokenProcessPool as exc:  # every worker died at start: an environment error, not an answer
                raise WorkerStartError(f"reward workers died while starting ({exc}); their stderr is this "
                                       "process's stderr") from exc
            except ProcessExpired as exc:
                if exc.exitcode == -signal.SIGPROF:  # the worker's CPU-time limit (worker.call) ended it
                    self._count("timeouts")
                    return CallResult(None, True, None, time.perf_counter() - t0)
                return self._error(f"worker died: {exc} (exit code {exc.exitcode})", t0)
            except Exception as exc:  # noqa: BLE001 - the function raised: reported as an error, not raised
                return self._error(f"{type(exc).__name__}: {exc}", t0)
        return CallResult(value, False, None, time.perf_counter() - t0)

    def _error(self, message: str, t0: float) -> CallResult:
        self._count("errors")
        return CallResult(None, False, message[:500], time.perf_counter() - t0)

    def close(self) -> None:
        """Stop the workers (idempotent); calls in flight in other threads fail with an error."""
        with self._lock:
            pool, self._pool = self._pool, None
            own = self._pid == os.getpid()
        if pool is not None and own:
            pool.stop()
            pool.join()
