"""What a scorer needs of ``reward_model.ground_truth``, checked before anything is scored.

verl's reward managers pass ``data_item.non_tensor_batch["reward_model"]["ground_truth"]`` to the reward function as
it is (``verl.experimental.reward_loop.reward_manager.dapo.DAPORewardManager.run_single``). A ``None`` there (a parquet
row whose ground truth is null) used to become the string ``"None"`` and score every response −1, correct ones
included: a run whose rewards are wrong with nothing on screen. :func:`ground_truth_problem` says what is wrong with a
value, and is used twice: by the launcher on every row before Ray (:mod:`stapo_verl.launch.data_checks`) and by
:func:`stapo_verl.rewards.routing.compute_score`, which raises :class:`GroundTruthError` for data that bypasses the
launcher.

Standard library only (the reward workers import this package without verl or torch).
"""

from __future__ import annotations

import math
import numbers

#: what every scorer of :mod:`stapo_verl.rewards.routing` accepts as a ground truth (it compares strings: a number is
#: converted with ``str``)
ACCEPTED = "a non-empty string or a finite number"


class GroundTruthError(ValueError):
    """A ground truth no scorer can compare with (missing, empty, of another type): scoring it would call every
    response wrong. The message names the data source, the value and the fix.

    Attributes:
        data_source: the row's ``data_source``. value: the ground truth given. problem: what is wrong with it.
    """

    def __init__(self, data_source, value, problem: str):
        self.data_source, self.value, self.problem = data_source, value, problem
        super().__init__(
            f"reward_model.ground_truth={value!r} (data_source={data_source!r}) {problem}: the scorer would call every "
            f"response wrong, correct ones included. Fix: give the row its answer ({ACCEPTED}), or leave the row out "
            f"(python -m stapo_verl.launch.data_checks --drop-bad-rows IN OUT)")


def ground_truth_problem(value) -> str | None:
    """None when ``value`` is :data:`ACCEPTED`, else what is wrong with it (``"is missing"``, ``"is empty"``, ``"is a
    list, needed ..."``, ``"is not finite"``).

    Args:
        value: ``reward_model.ground_truth`` of one row (any Python or numpy value).
    """
    if value is None:
        return "is missing"
    if isinstance(value, str):
        return None if value.strip() else "is empty"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"is a {type(value).__name__}, needed {ACCEPTED}"
    return None if math.isfinite(float(value)) else "is not finite"
