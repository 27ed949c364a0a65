"""Hard per-call wall-clock timeouts for reward scoring, in killable worker processes.

Why (``verl_notes.md`` bug D12): a degenerate answer can make verl's ``normalize_final_answer`` regexes or
math-verify/sympy run for minutes (e.g. ``\\boxed{5^{5^{5^{5^{5}}}}}`` makes ``math_verify.verify`` evaluate a
power tower). ``signal.alarm`` does not work in verl's reward threads, and verl's own
``utils/reward_score/math_verify.py`` abandons a timed-out future while its pool process keeps running. Here every
call runs in a *persistent* worker process; on timeout that worker is SIGKILLed, reaped and replaced lazily, so a
hung parser can neither block training nor leak a process.

Design (measured numbers are in ``docs/data_rewards_eval.md``):

* Each worker is a ``python -c "...worker_main()"`` subprocess speaking length-prefixed pickles over
  stdin/stdout. Not ``multiprocessing``: its spawn/forkserver methods re-import the caller's ``__main__`` (which
  breaks scripts without a main guard), and ``fork`` from verl's multi-threaded reward workers is unsafe.
* A worker imports math-verify and verl's ``math_dapo`` before it reports ready, and its start-up is not charged
  to any call's timeout. A call then costs one pipe round trip when a worker is idle.
* The pool is thread-safe: up to ``max_workers`` calls run concurrently (verl's reward managers call
  ``compute_score`` through ``loop.run_in_executor(None, ...)``, i.e. from a thread pool); further calls wait.
* Workers arm ``PR_SET_PDEATHSIG`` (Linux; they are forked from one long-lived spawner thread, because the signal
  follows the forking *thread*) so they die with the trainer even if it is SIGKILLed, and set an ``RLIMIT_AS``
  cap (env ``STAPO_REWARD_WORKER_MEM_MB``, default 8192) so a runaway big-integer computation fails with
  ``MemoryError`` instead of exhausting the host.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import logging
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Default hard timeout per scored sample, in seconds (env ``STAPO_REWARD_TIMEOUT_S`` overrides).
DEFAULT_TIMEOUT_S = 5.0
#: Modules imported once into the fork server so that (re)started workers do not pay their import cost.
_PRELOAD = ["stapo_verl.rewards.dapo", "stapo_verl.rewards.math_verify_scorer"]


@dataclasses.dataclass
class CallResult:
    """Outcome of one :meth:`KillableRunner.run` call.

    Attributes:
        value: the function's return value (``None`` on timeout or error).
        timed_out: True when the call exceeded its timeout and the worker was killed.
        error: ``"ExcType: message"`` when the function raised or the worker died, else ``None``.
        elapsed_s: wall-clock seconds spent in :meth:`KillableRunner.run`, including any worker start.
    """

    value: Any
    timed_out: bool
    error: str | None
    elapsed_s: float


def _set_child_limits() -> None:
    """Die with the parent (Linux) and cap the address space; both best effort."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass
    mem_mb = int(os.environ.get("STAPO_REWARD_WORKER_MEM_MB", "8192"))
    if mem_mb > 0:
        try:
            import resource

            limit = mem_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass


def _write_msg(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_exact(stream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError("worker pipe closed")
        buf += chunk
    return buf


def _read_msg(stream):
    (n,) = struct.unpack("<Q", _read_exact(stream, 8))
    return pickle.loads(_read_exact(stream, n))


def worker_main() -> None:
    """Entry point of a worker process (started by :class:`_Spawner`).

    Protocol on stdin/stdout: length-prefixed pickles. Sends ``"ready"`` after the preloads, then answers each
    ``(fn, args, kwargs)`` with ``(ok, value_or_error)``; exits on ``None`` or EOF.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it kills us explicitly
    parent = int(os.environ.get("STAPO_REWARD_PARENT_PID", "0"))
    _set_child_limits()
    if parent and os.getppid() != parent:  # the parent died before PDEATHSIG was armed
        return
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints from scorers must not corrupt the protocol
    for name in _PRELOAD:  # imported before "ready" so their cost never counts against a call's timeout
        importlib.import_module(name)
    from stapo_verl.rewards import dapo, math_verify_scorer

    dapo.normalize_final_answer("1")
    math_verify_scorer._math_verify()
    _write_msg(stdout, "ready")
    while True:
        try:
            msg = _read_msg(stdin)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args, kwargs = msg
        try:
            reply = (True, fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as a wrong answer
            reply = (False, f"{type(exc).__name__}: {exc}"[:500])
        try:
            _write_msg(stdout, reply)
        except (EOFError, OSError):
            return


class _Spawner:
    """Starts worker processes from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits; verl calls the reward function from
    short-lived executor threads, so workers are always forked from this thread, which lives as long as the process.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._pid = os.getpid()
        threading.Thread(target=self._loop, name="stapo-reward-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            done, box = self._requests.get()
            try:
                env = dict(os.environ)
                env["STAPO_REWARD_PARENT_PID"] = str(os.getpid())
                # The child must import this package from wherever the parent does (editable installs, tests).
                env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
                box.append(
                    subprocess.Popen(
                        [sys.executable, "-c", "from stapo_verl.rewards.timeout import worker_main; worker_main()"],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        env=env,
                        close_fds=True,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - handed to the requesting thread
                box.append(exc)
            done.set()

    def popen(self) -> subprocess.Popen:
        done, box = threading.Event(), []
        self._requests.put((done, box))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _get_spawner() -> _Spawner:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner._pid != os.getpid():
            _spawner = _Spawner()
        return _spawner


class _Worker:
    """One worker process with its stdin/stdout pipes."""

    def __init__(self, start_timeout_s: float) -> None:
        self.proc = _get_spawner().popen()
        self.pid = self.proc.pid
        if not self.readable(start_timeout_s) or self.recv() != "ready":
            self.kill()
            raise RuntimeError(f"reward worker did not start within {start_timeout_s} s")

    def readable(self, timeout: float) -> bool:
        r, _, _ = select.select([self.proc.stdout], [], [], max(0.0, timeout))
        return bool(r)

    def send(self, obj) -> None:
        _write_msg(self.proc.stdin, obj)

    def recv(self):
        return _read_msg(self.proc.stdout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap the process (no zombie), then close the pipes."""
        try:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not within 1 s."""
        try:
            self.send(None)
            self.proc.wait(timeout=1)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()


class KillableRunner:
    """Run picklable module-level functions in worker processes with a hard wall-clock timeout.

    Args:
        timeout_s: default per-call timeout in seconds (> 0).
        max_workers: most concurrent calls / live workers; default ``min(4, os.cpu_count())``
            (env ``STAPO_REWARD_WORKERS`` overrides).

        start_timeout_s: how long a new worker may take to import its modules (not charged to any call).

    Counters ``calls``, ``timeouts``, ``errors`` and ``respawns`` (worker starts) are kept in :attr:`stats`.
    Thread-safe. After ``os.fork()`` a child process transparently starts its own workers.

    Raises:
        ValueError: ``timeout_s <= 0`` or ``max_workers < 1``.
    """

    def __init__(
        self, timeout_s: float = DEFAULT_TIMEOUT_S, max_workers: int | None = None, start_timeout_s: float = 120.0
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_workers is None:
            max_workers = int(os.environ.get("STAPO_REWARD_WORKERS", min(4, os.cpu_count() or 1)))
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers!r}")
        self.timeout_s = float(timeout_s)
        self.max_workers = max_workers
        self.start_timeout_s = float(start_timeout_s)
        self._lock = threading.Lock()
        self._reset_state()
        _RUNNERS.add(self)

    def _reset_state(self) -> None:
        self._pid = os.getpid()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._slots = threading.BoundedSemaphore(self.max_workers)
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0, "respawns": 0}

    def _check_fork(self) -> None:
        if os.getpid() != self._pid:  # inherited from a parent: its workers are not ours to talk to
            with self._lock:
                if os.getpid() != self._pid:
                    self._reset_state()

    def _acquire_worker(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        worker = _Worker(self.start_timeout_s)
        with self._lock:
            self._all.add(worker)
            self.stats["respawns"] += 1
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> CallResult:
        """Call ``fn(*args, **kwargs)`` in a worker; kill the worker if it takes longer than ``timeout_s``.

        Args:
            fn: a module-level (picklable) function; its result must be picklable.
            timeout_s: override of the runner's default timeout for this call.

        Returns:
            A :class:`CallResult`. Never raises for failures inside ``fn``; they come back in ``error``.
        """
        self._check_fork()
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        t0 = time.perf_counter()
        with self._slots:
            worker = self._acquire_worker()
            with self._lock:
                self.stats["calls"] += 1
            # The timeout starts after the worker is up: a restart after a timeout is not charged to this call.
            try:
                worker.send((fn, args, kwargs))
                ready = worker.readable(timeout)
            except (OSError, EOFError, ValueError) as exc:
                self._discard(worker)
                with self._lock:
                    self.stats["errors"] += 1
                return CallResult(None, False, f"worker pipe failed: {exc}", time.perf_counter() - t0)
            if not ready:
                self._discard(worker)
                with self._lock:
                    self.stats["timeouts"] += 1
                return CallResult(None, True, None, time.perf_counter() - t0)
            try:
                ok, value = worker.recv()
            except (EOFError, OSError) as exc:  # the worker died (e.g. killed by the OOM killer)
                self._discard(worker)
                with self._lock:
                    self.stats["errors"] += 1
                return CallResult(None, False, f"worker died: {exc!r}", time.perf_counter() - t0)
            with self._lock:
                self._idle.append(worker)
                if not ok:
                    self.stats["errors"] += 1
            if ok:
                return CallResult(value, False, None, time.perf_counter() - t0)
            return CallResult(None, False, value, time.perf_counter() - t0)

    def worker_pids(self) -> list[int]:
        """PIDs of this runner's live workers (for leak checks in tests)."""
        with self._lock:
            return [w.pid for w in self._all if w.alive()]

    def close(self) -> None:
        """Stop all workers of this runner (idempotent). Calls in flight in other threads are not waited for."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            workers, self._idle, self._all = list(self._all), [], set()
        for w in workers:
            w.stop()


_RUNNERS: weakref.WeakSet[KillableRunner] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for runner in list(_RUNNERS):
        runner.close()
