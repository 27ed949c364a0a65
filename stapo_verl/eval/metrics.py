"""avg@k and the unbiased pass@k estimator, as reported in the STAPO paper (https://arxiv.org/abs/2602.15620).

* avg@k: per problem, the mean accuracy of its k samples; then the mean over problems (the paper's "mean
  accuracy over samples"). With the same k for every problem this equals the mean over all samples.
* pass@k: Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1), per problem with n samples
  of which c are correct: ``1 − C(n−c, k) / C(n, k)``, averaged over problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from types import MappingProxyType

#: Samples per problem used by the paper: 32 for the small AIME/AMC sets, 4 for the others.
K_BY_BENCHMARK = MappingProxyType({"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4,
                                   "olympiadbench": 4, "gsm8k": 4})
#: The six benchmarks averaged (unweighted) in the paper's "Avg" column, in table order.
SIX_BENCHMARKS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem: ``1 − C(n−c, k)/C(n, k)``.

    Args:
        n: samples drawn (≥ k).
        c: correct samples (0 ≤ c ≤ n).
        k: budget.

    Raises:
        ValueError: ``k < 1``, ``k > n`` or ``c`` outside ``[0, n]``.
    """
    if k < 1 or k > n or not 0 <= c <= n:
        raise ValueError(f"need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def avg_at_k(per_problem: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of the per-problem sample accuracy.

    Raises:
        ValueError: no problems, or a problem without samples.
    """
    if not per_problem:
        raise ValueError("avg@k needs at least one problem")
    if any(len(s) == 0 for s in per_problem):
        raise ValueError("every problem needs at least one sample")
    return sum(sum(map(bool, s)) / len(s) for s in per_problem) / len(per_problem)


def mean_pass_at_k(per_problem: Sequence[Sequence[bool]], k: int) -> float:
    """Mean over problems of :func:`pass_at_k` with each problem's own n and c."""
    if not per_problem:
        raise ValueError("pass@k needs at least one problem")
    return sum(pass_at_k(len(s), sum(map(bool, s)), k) for s in per_problem) / len(per_problem)
