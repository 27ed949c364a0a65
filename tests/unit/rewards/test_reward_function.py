"""The reward function owns its killable workers: ``stapo_verl.rewards.compute_score`` is a new
:class:`~stapo_verl.rewards.routing.RewardFunction` at every lookup (verl looks it up once per reward manager), the
runner is created on the first call that needs one, and nothing is kept at module level (in process, no worker
started: the workers themselves are tests/integration/rewards)."""

from __future__ import annotations

import pickle

import pytest

import stapo_verl.rewards as rewards
from stapo_verl.rewards import KillableRunner, RewardFunction
from stapo_verl.rewards.routing import compute_score


def test_each_lookup_is_a_new_function_with_its_own_runner(monkeypatch):
    monkeypatch.setenv("STAPO_REWARD_TIMEOUT_S", "7.5")
    a, b = rewards.compute_score, rewards.compute_score
    assert isinstance(a, RewardFunction) and isinstance(b, RewardFunction) and a is not b
    assert a.runner is a.runner and a.runner is not b.runner  # one runner per function, created on first use
    assert a.runner.timeout_s == 7.5  # the environment's timeout, read when the runner is made
    from stapo_verl.rewards import compute_score as imported

    assert isinstance(imported, RewardFunction) and imported is not a
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rewards.nope  # noqa: B018


def test_in_process_scoring_starts_no_runner():
    score = RewardFunction()
    out = score("math500", "\\boxed{\\frac12}", "0.5", timeout_s=0)
    assert out == {"score": 1.0, "acc": True, "pred": "\\frac12", "timeout": False, "no_box": False,
                   "data_source": "math500", "ground_truth_error": False}
    assert score._runner is None


def test_a_bad_timeout_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv("STAPO_REWARD_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="STAPO_REWARD_TIMEOUT_S='soon' must be a number of seconds"):
        RewardFunction()("math500", "\\boxed{1}", "1")


def test_compute_score_needs_a_runner_unless_in_process():
    with pytest.raises(ValueError, match=r"compute_score\(timeout_s=None\) needs a runner"):
        compute_score("math500", "\\boxed{1}", "1")
    assert compute_score("math500", "\\boxed{1}", "1", timeout_s=0)["acc"] is True


def test_a_copy_starts_without_workers_and_close_is_idempotent():
    runner = KillableRunner(timeout_s=3, max_workers=1)
    score = RewardFunction(runner)
    assert score.runner is runner
    copy = pickle.loads(pickle.dumps(score))
    assert isinstance(copy, RewardFunction) and copy._runner is None
    with score:
        pass
    assert score._runner is None
    score.close()
