"""Import a script of ``benchmarks/`` (not a package) as a module for a test."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def benchmark_module(name: str):
    """``benchmarks/<name>.py`` imported as module ``name`` for the block (registered in ``sys.modules`` meanwhile,
    which dataclasses need to resolve their annotations)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
