"""Rule-based math rewards for verl 0.9.1 with hard per-sample timeouts.

Use as verl's custom reward function (``verl.trainer.ppo.reward.get_custom_reward_fn``)::

    reward.custom_reward_function.path=pkg://stapo_verl.rewards
    reward.custom_reward_function.name=compute_score

with verl's built-in ``naive`` or ``dapo`` reward-loop manager (``reward.reward_manager.name``); no custom manager is
registered, because a registration done only in the driver would be missing in the reward-loop workers, while the
custom function is loaded by path inside every worker.

``compute_score`` is a new :class:`~stapo_verl.rewards.routing.RewardFunction` at every lookup (this package's
``__getattr__``): verl looks it up once per reward manager and keeps it, so the killable worker processes it scores
in belong to that manager, not to this package. ``from stapo_verl.rewards import compute_score`` gives the importer
its own.

Importing this package imports neither verl nor torch (nor math-verify, which only the worker processes load).

Modules: :mod:`.extract` (boxes, ``Answer:`` lines), :mod:`.equivalence` (math-verify with per-route tolerance),
:mod:`.dapo` (strict training scorers), :mod:`.math_verify_scorer` (benchmarks), :mod:`.verl_rules` (copies of verl's
normalisers), :mod:`.timeout` and :mod:`.worker` (killable worker processes), :mod:`.routing` (``data_source`` →
scorer, :func:`compute_score`), :mod:`.ledger` (the standard-library, math-verify and pebble sites the reward code
patches or relies on, and their gate).
"""

from stapo_verl.rewards.dapo import extract_boxed_answer, extract_final_answer, score_dapo_format, score_strict_box
from stapo_verl.rewards.equivalence import EXACT, RELATIVE_1E4, Tolerance, answers_equivalent
from stapo_verl.rewards.math_verify_scorer import score_math_verify
from stapo_verl.rewards.routing import (
    DAPO_FORMAT,
    MATH_VERIFY,
    RESULT_KEYS,
    STRICT_BOX,
    RewardFunction,
    UnknownDataSourceError,
    route_for,
    runner_from_env,
    scorer_for,
)
from stapo_verl.rewards.timeout import CallResult, KillableRunner, WorkerStartError

__all__ = [
    "DAPO_FORMAT",
    "EXACT",
    "MATH_VERIFY",
    "RELATIVE_1E4",
    "RESULT_KEYS",
    "STRICT_BOX",
    "CallResult",
    "KillableRunner",
    "RewardFunction",
    "Tolerance",
    "UnknownDataSourceError",
    "WorkerStartError",
    "answers_equivalent",
    "compute_score",
    "extract_boxed_answer",
    "extract_final_answer",
    "route_for",
    "runner_from_env",
    "score_dapo_format",
    "score_math_verify",
    "score_strict_box",
    "scorer_for",
]


def __getattr__(name: str):
    """``compute_score``: a new :class:`~stapo_verl.rewards.routing.RewardFunction` (module docstring).

    Raises:
        AttributeError: any other name.
    """
    if name == "compute_score":
        return RewardFunction()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
