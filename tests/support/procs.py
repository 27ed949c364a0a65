"""Helpers for tests that start processes: free TCP ports, a clean environment for child interpreters."""

from __future__ import annotations

import os
import socket
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
