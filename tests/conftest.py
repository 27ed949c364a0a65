"""Shared test fixtures: verl ActorConfig builders and deterministic seeds."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def shared_present():
    """Fail (never skip) when ``../shared/data`` is missing: CI lays it beside the clone."""
    from test_data_prepare import SHARED

    if SHARED is None:
        pytest.fail("shared/data not found beside the repository (or set STAPO_SHARED_DIR)")
