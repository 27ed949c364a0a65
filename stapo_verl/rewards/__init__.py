"""Rule-based math rewards for verl 0.9.1 with hard per-sample timeouts.

Use as verl's custom reward function (``verl/trainer/ppo/reward.py:get_custom_reward_fn``)::

    reward.custom_reward_function.path=pkg://stapo_verl.rewards
    reward.custom_reward_function.name=compute_score

with verl's built-in ``naive`` or ``dapo`` reward-loop manager (``reward.reward_manager.name``); no custom manager is
registered, because a registration done only in the driver would be missing in the reward-loop workers, while the
custom function is loaded by path inside every worker.

Modules: :mod:`.dapo` (strict box / DAPO ``Answer:`` line, training), :mod:`.math_verify_scorer` (benchmarks),
:mod:`.normalize` (verl's answer normalisers), :mod:`.timeout` (killable workers), :mod:`.routing`
(``data_source`` → scorer, :func:`compute_score`).
"""

from stapo_verl.rewards.dapo import (
    extract_boxed_answer,
    extract_final_answer,
    find_last_boxed,
    score_dapo_format,
    score_strict_box,
)
from stapo_verl.rewards.math_verify_scorer import answers_equivalent, score_math_verify
from stapo_verl.rewards.routing import (
    DAPO_FORMAT,
    MATH_VERIFY,
    STRICT_BOX,
    UnknownDataSourceError,
    compute_score,
    get_runner,
    scorer_for,
)
from stapo_verl.rewards.timeout import CallResult, KillableRunner

__all__ = [
    "DAPO_FORMAT",
    "MATH_VERIFY",
    "STRICT_BOX",
    "CallResult",
    "KillableRunner",
    "UnknownDataSourceError",
    "answers_equivalent",
    "compute_score",
    "extract_boxed_answer",
    "extract_final_answer",
    "find_last_boxed",
    "get_runner",
    "score_dapo_format",
    "score_math_verify",
    "score_strict_box",
    "scorer_for",
]
