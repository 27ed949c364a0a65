"""Hard per-call wall-clock timeouts for reward scoring, in killable worker processes.

Why (``verl_notes.md`` bug D12): a degenerate answer can make verl's ``normalize_final_answer`` regexes or
math-verify/sympy run for minutes (e.g. ``\\boxed{5^{5^{5^{5^{5}}}}}`` makes ``math_verify.verify`` evaluate a
power tower). ``signal.alarm`` does not work in verl's reward threads, and verl's own
``utils/reward_score/math_verify.py`` abandons a timed-out future while its pool process keeps running. Here every
call runs in a *persistent* worker process; on timeout that worker is SIGKILLed, reaped and replaced lazily, so a
hung parser can neither block training nor leak a process.

Design (measured numbers are in ``docs/data_rewards_eval.md``):

* One fork server ("zygote") per trainer process: a ``python -c ...zygote_main()`` subprocess that imports
  math-verify and verl's ``math_dapo`` once. Workers are forked from it on request (single-threaded, so forking
  is safe even though verl calls us from many threads) and talk to us over a Unix socket pair with
  length-prefixed pickles. A replacement worker after a timeout is ready in a few milliseconds.
  Not ``multiprocessing``: its spawn/forkserver methods re-import the caller's ``__main__`` (breaking scripts
  without a main guard), and ``fork`` from verl's multi-threaded reward workers is unsafe.
* A failed start is explained: until the scorers are imported the zygote's stderr is a pipe that the parent reads
  (and forwards); if the zygote dies or hangs, the ``RuntimeError`` carries its exit code and the end of that
  stderr (e.g. ``ModuleNotFoundError: No module named 'math_verify'``). Once ready, the zygote switches its stderr
  back to the trainer's, so workers' warnings reach the trainer's log as before.
* A call costs one socket round trip (tens of microseconds) when a worker is idle; a worker start is never
  charged to a call's timeout.
* The pool is thread-safe: up to ``max_workers`` calls run concurrently (verl's reward managers call
  ``compute_score`` through ``loop.run_in_executor(None, ...)``, i.e. from a thread pool); further calls wait.
* No leaks: the zygote ignores ``SIGCHLD`` so the kernel reaps killed workers; ``PR_SET_PDEATHSIG`` (Linux) makes
  the zygote die with the trainer (it is started from one long-lived spawner thread, because the signal follows
  the forking *thread*) and the workers die with the zygote, even if the trainer is SIGKILLed. Workers also set
  an ``RLIMIT_AS`` cap (env ``STAPO_REWARD_WORKER_MEM_MB``, default 8192) so a runaway big-integer computation
  fails with ``MemoryError`` instead of exhausting the host.
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
import socket
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
#: Bytes of the fork server's stderr kept for the error raised when it fails to start.
STDERR_TAIL_BYTES = 4000
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


def _set_child_limits(address_space: bool = True) -> None:
    """Die with the parent (Linux) and cap the address space; both best effort."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass
    mem_mb = int(os.environ.get("STAPO_REWARD_WORKER_MEM_MB", "8192"))
    if address_space and mem_mb > 0:
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


def _preload() -> None:
    """Import (and warm) the scorer modules, so that forked workers start ready to score."""
    for name in _PRELOAD:
        importlib.import_module(name)
    from stapo_verl.rewards import math_verify_scorer, normalize

    normalize.canonical_answer("1")  # loads verl's math_dapo.py and math_reward.py once
    math_verify_scorer._math_verify()


def _serve(rfile, wfile) -> None:
    """Worker loop: send ``"ready"``, then answer each ``(fn, args, kwargs)`` with ``(ok, value_or_error)``."""
    _write_msg(wfile, "ready")
    while True:
        try:
            msg = _read_msg(rfile)
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
            _write_msg(wfile, reply)
        except (EOFError, OSError):
            return


def zygote_main(ctrl_fd: int, stderr_fd: int = -1) -> None:
    """Entry point of the fork-server ("zygote") process, started by :class:`_Zygote`.

    Imports the scorers once, then for every file descriptor received on the control socket forks a worker that
    serves :func:`_serve` on it, and replies with the worker's PID (8 bytes). ``SIGCHLD`` is ignored, so the kernel
    reaps killed workers (no zombies). Exits when the control socket closes or its parent dies.

    Args:
        ctrl_fd: the inherited control socket.
        stderr_fd: a copy of the parent's stderr. Until the scorers are imported, stderr is a pipe that the parent
            reads, so that a failed start (e.g. ``math_verify`` not installed) reaches the parent's error message;
            once ready, stderr is switched to this descriptor (``/dev/null`` when ``-1``) and the pipe is closed.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    parent = int(os.environ.get("STAPO_REWARD_PARENT_PID", "0"))
    _set_child_limits(address_space=False)
    if parent and os.getppid() != parent:  # the parent died before PDEATHSIG was armed
        return
    sys.stdout = sys.stderr  # stray prints must not reach the parent's stdout protocol users
    ctrl = socket.socket(fileno=ctrl_fd)
    _preload()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    sys.stderr.flush()
    target = stderr_fd if stderr_fd >= 0 else os.open(os.devnull, os.O_WRONLY)
    os.dup2(target, 2)  # workers forked from now on write to the trainer's stderr, as before; the pipe sees EOF
    os.close(target)
    ctrl.sendall(b"R")
    me = os.getpid()
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctrl, 1, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        pid = os.fork()
        if pid == 0:  # worker: forked from this single-threaded process, so forking is safe
            try:
                ctrl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _set_child_limits()
                if os.getppid() == me:
                    sock = socket.socket(fileno=fds[0])
                    _serve(sock.makefile("rb"), sock.makefile("wb"))
            finally:
                os._exit(0)
        os.close(fds[0])
        ctrl.sendall(struct.pack("<q", pid))


class _Spawner:
    """Starts the zygote from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits; verl calls the reward function from
    executor threads that may come and go, so the zygote is always started from this thread, which lives as long
    as the process.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue = queue.Queue()
        self._pid = os.getpid()
        threading.Thread(target=self._loop, name="stapo-reward-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fd, done, box = self._requests.get()
            err_fd = -1
            try:
                env = dict(os.environ)
                env["STAPO_REWARD_PARENT_PID"] = str(os.getpid())
                # The child must import this package from wherever the parent does (editable installs, tests).
                env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
                try:
                    err_fd = os.dup(2)  # the child's stderr once it is ready (see zygote_main)
                except OSError:
                    err_fd = -1
                code = f"from stapo_verl.rewards.timeout import zygote_main; zygote_main({fd}, {err_fd})"
                fds = (fd,) if err_fd < 0 else (fd, err_fd)
                box.append(subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=fds,
                                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE))
            except BaseException as exc:  # noqa: BLE001 - handed to the requesting thread
                box.append(exc)
            finally:
                if err_fd >= 0:
                    os.close(err_fd)
            done.set()

    def popen(self, fd: int) -> subprocess.Popen:
        """Start a zygote that inherits ``fd`` (its control socket), stderr piped; raises what ``Popen`` raised."""
        done, box = threading.Event(), []
        self._requests.put((fd, done, box))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


class _Zygote:
    """Parent-side handle of the fork server: ``fork_worker()`` returns a ready-to-use worker in milliseconds.

    Raises:
        RuntimeError: the server exited before it was ready, or was not ready within ``start_timeout_s``; the
            message carries its exit code and the last :data:`STDERR_TAIL_BYTES` of its stderr.
    """

    def __init__(self, start_timeout_s: float) -> None:
        self.sock, child = socket.socketpair()
        try:
            self.proc = _get_spawner().popen(child.fileno())
        finally:
            child.close()
        self.lock = threading.Lock()
        self._stderr_tail = bytearray()
        state = self._wait_ready(start_timeout_s)
        if state == "timeout":
            self.proc.kill()  # first, so that its stderr pipe reaches EOF
        self._drain_stderr(2.0 if state == "ready" else 5.0)  # ready: the child closed the pipe; else: last words
        if state != "ready":
            if state == "timeout":
                what = f"did not start within {start_timeout_s} s (killed)"
            else:
                what = f"exited before it was ready (start timeout {start_timeout_s} s)"
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - closed the socket yet does not exit
                self.proc.kill()
                code = self.proc.wait(timeout=5)
            self.sock.close()
            tail = self._stderr_tail.decode("utf-8", "replace").rstrip() or "<empty>"
            raise RuntimeError(f"reward fork server {what}, exit code {code}; end of its stderr:\n{tail}")

    def _wait_ready(self, timeout: float) -> str:
        """Read the server's stderr while waiting for its ready byte: ``"ready"``, ``"eof"`` (it closed the control
        socket: died) or ``"timeout"``."""
        deadline = time.monotonic() + timeout
        err = self.proc.stderr
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            watch = [self.sock] if err is None or err.closed else [self.sock, err]
            readable, _, _ = select.select(watch, [], [], left)
            if err is not None and err in readable:
                self._read_stderr()
            if self.sock in readable:
                return "ready" if self.sock.recv(1) == b"R" else "eof"

    def _read_stderr(self) -> None:
        """Forward one chunk of the server's startup stderr to ours and keep its tail; close the pipe at EOF."""
        err = self.proc.stderr
        chunk = os.read(err.fileno(), 65536)
        if not chunk:
            err.close()
            return
        try:
            os.write(2, chunk)  # startup warnings stay visible, as when the server wrote to our stderr directly
        except OSError:
            pass
        self._stderr_tail += chunk
        del self._stderr_tail[:-STDERR_TAIL_BYTES]

    def _drain_stderr(self, timeout: float) -> None:
        """Read the startup pipe to EOF (at most ``timeout`` seconds), then close it."""
        err = self.proc.stderr
        deadline = time.monotonic() + timeout
        while err is not None and not err.closed:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([err], [], [], left)[0]:
                err.close()
                return
            self._read_stderr()

    def alive(self) -> bool:
        """Whether the fork server is still running."""
        return self.proc.poll() is None

    def fork_worker(self) -> tuple[int, socket.socket]:
        """Fork a worker; returns its PID and our end of its socket. Raises ``EOFError`` if the server died."""
        ours, theirs = socket.socketpair()
        try:
            with self.lock:
                socket.send_fds(self.sock, [b"F"], [theirs.fileno()])
                data = b""
                while len(data) < 8:
                    chunk = self.sock.recv(8 - len(data))
                    if not chunk:
                        raise EOFError("reward fork server exited")
                    data += chunk
        finally:
            theirs.close()
        return struct.unpack("<q", data)[0], ours

    def close(self) -> None:
        """Close the control socket (the server exits on EOF); kill it if it does not within 2 s."""
        try:
            self.sock.close()
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=5)


_spawner: _Spawner | None = None
_zygote: _Zygote | None = None
_global_lock = threading.Lock()


def _get_spawner() -> _Spawner:
    global _spawner
    if _spawner is None or _spawner._pid != os.getpid():
        _spawner = _Spawner()
    return _spawner


def _get_zygote(start_timeout_s: float) -> _Zygote:
    global _zygote
    with _global_lock:
        if _zygote is None or not _zygote.alive() or _spawner is None or _spawner._pid != os.getpid():
            _zygote = _Zygote(start_timeout_s)
        return _zygote


class _Worker:
    """One worker process (a child of the zygote) and the socket to it."""

    def __init__(self, start_timeout_s: float) -> None:
        self.pid, self.sock = _get_zygote(start_timeout_s).fork_worker()
        self.rfile, self.wfile = self.sock.makefile("rb"), self.sock.makefile("wb")
        if not self.readable(start_timeout_s) or self.recv() != "ready":
            self.kill()
            raise RuntimeError(f"reward worker did not start within {start_timeout_s} s")

    def readable(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a reply; True when one can be read."""
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        return bool(r)

    def send(self, obj) -> None:
        """Send one pickled message."""
        _write_msg(self.wfile, obj)

    def recv(self):
        """Read one pickled message (blocks; call :meth:`readable` first). Raises ``EOFError`` if it died."""
        return _read_msg(self.rfile)

    def alive(self) -> bool:
        """Whether the worker process exists."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - PID reused by another user's process
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the worker (the zygote reaps it) and close the socket."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for f in (self.rfile, self.wfile, self.sock):
            try:
                f.close()
            except OSError:
                pass

    def stop(self) -> None:
        """Ask an idle worker to exit, then make sure it is gone."""
        try:
            self.send(None)
        except (OSError, ValueError):
            pass
        self.kill()



class KillableRunner:
    """Run picklable module-level functions in worker processes with a hard wall-clock timeout.

    Args:
        timeout_s: default per-call timeout in seconds (> 0).
        max_workers: most concurrent calls / live workers; default ``min(4, os.cpu_count())``
            (env ``STAPO_REWARD_WORKERS`` overrides).

        start_timeout_s: how long the fork server may take to import the scorers (not charged to any call).

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
    if _zygote is not None and _spawner is not None and _spawner._pid == os.getpid():
        _zygote.close()
