"""Helpers for tests that start processes: free TCP ports, a clean environment for child interpreters."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

#: the repository root and the tests directory (child jobs put ``tests/`` on ``PYTHONPATH`` to import ``support``)
REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**overrides: str) -> dict[str, str]:
    """``os.environ`` plus ``tests/`` on ``PYTHONPATH`` (so a job script can ``import support``) and overrides."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.update(overrides)
    return env


@contextlib.contextmanager
def cpu_burner():
    """A busy-looping Python process for the duration of the block (another CPU-bound job on the machine)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def kill_tree(pid: int) -> list[int]:
    """``kill -9`` a process and every process below it at once (the whole job: the recipe's shell, the launcher,
    the Ray head it started and every Ray worker); returns the pids killed."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    return [p.pid for p in procs]


def no_shm_orphans_since(started: float, prefixes: tuple[str, ...] | None = None, wait_s: float = 15.0) -> bool:
    """True when no ``/dev/shm`` entry created since ``started`` is held by no process
    (:func:`stapo_verl.launch.shm.orphans`), within ``wait_s``: a job running beside the test removes its own once its
    Ray is down, which may take a few seconds."""
    import time

    from stapo_verl.launch import shm

    kwargs = {} if prefixes is None else {"prefixes": prefixes}
    deadline = time.monotonic() + wait_s
    while shm.orphans(started, **kwargs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
