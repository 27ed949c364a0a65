"""Test-suite wiring: the kind markers (from the directory a test lives in) and the environment every test gets.

Kinds: ``tests/unit`` (in-process, seconds), ``tests/integration`` (verl engines and workers, gloo jobs, processes),
``tests/e2e`` (the real ``python -m verl.trainer.main_ppo``). Select with ``-m``, e.g.
``bash scripts/test.sh -m "not e2e"``.
"""

import os
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import pytest  # noqa: E402

KINDS = ("unit", "integration", "e2e")
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """Mark every test with its kind; a test outside the three kind directories is an error."""
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(_TESTS)
        kind = rel.parts[0]
        if kind not in KINDS:
            raise pytest.UsageError(f"{rel}: tests live under tests/{{{','.join(KINDS)}}}/")
        item.add_marker(getattr(pytest.mark, kind))
