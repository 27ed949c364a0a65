"""Paired confidence intervals for multi-seed comparisons of two training arms.

Two arms run from the same seeds give one value each per seed; the paired difference d_s = b_s − a_s removes the
between-seed variance both arms share. The interval is Student's t interval of the mean difference:

    mean(d) ± t_{n−1, (1+c)/2} · sd(d) / √n        (sd with n − 1 degrees of freedom)

valid for roughly normal differences; with 5 seeds it is wide, which is the honest answer at that sample size. The
t quantile is ``scipy.stats.t.ppf`` (scipy comes with the ``tools`` extra).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


def _check_confidence(confidence: float) -> None:
    """The confidence level c of every interval here: 0 < c < 1 (one check for all of them).

    Raises:
        ValueError: naming the value and the allowed range.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1)")


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided critical value t with P(|T| ≤ t) = ``confidence`` (t_{ν, (1+c)/2}), ν = ``df``.

    Args:
        confidence: c in (0, 1), e.g. 0.95.
        df: integer ν ≥ 1.

    Returns:
        t > 0 (ν = 4, c = 0.95: 2.7764451).

    Raises:
        ValueError: c outside (0, 1) or ν not an integer ≥ 1.

    Source: ``scipy.stats.t.ppf((1 + c) / 2, ν)``.
    """
    _check_confidence(confidence)
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df={df!r}: degrees of freedom must be an integer >= 1")
    from scipy.stats import t

    return float(t.ppf(0.5 * (1.0 + confidence), df))


@dataclass(frozen=True)
class PairedDifference:
    """The mean paired difference b − a over seeds and its confidence interval.

    Attributes:
        n: pairs with both values finite.
        mean: mean of d = b − a (NaN when n = 0).
        sd: sample standard deviation of d (n − 1 degrees of freedom; NaN when n < 2).
        half_width: t_{n−1, (1+c)/2} · sd / √n (NaN when n < 2).
        confidence: c.
    """

    n: int
    mean: float
    sd: float
    half_width: float
    confidence: float

    @property
    def low(self) -> float:
        """Lower end of the interval."""
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        """Upper end of the interval."""
        return self.mean + self.half_width

    def excludes_zero(self) -> bool:
        """True iff the interval lies strictly on one side of 0."""
        return math.isfinite(self.half_width) and (self.low > 0 or self.high < 0)

    def format(self, digits: int = 3) -> str:
        """``+0.012 [−0.004, +0.028]`` (or ``+0.012 (n=1)`` without an interval)."""
        if not math.isfinite(self.mean):
            return "—"
        if not math.isfinite(self.half_width):
            return f"{self.mean:+.{digits}f} (n={self.n})"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def paired_difference(a, b, confidence: float = 0.95) -> PairedDifference:
    """Mean of b − a over paired values and its Student-t confidence interval.

    Args:
        a, b: sequences of floats of one length, paired by position (seed); a pair with a non-finite value is
            dropped.
        confidence: c in (0, 1).

    Returns:
        :class:`PairedDifference`.

    Raises:
        ValueError: the lengths differ or c is outside (0, 1).
    """
    if len(a) != len(b):
        raise ValueError(f"paired_difference needs equally long sequences, got {len(a)} and {len(b)}")
    _check_confidence(confidence)
    d = [float(y) - float(x) for x, y in zip(a, b) if math.isfinite(float(x)) and math.isfinite(float(y))]
    n = len(d)
    if n == 0:
        return PairedDifference(0, math.nan, math.nan, math.nan, confidence)
    mean = statistics.fmean(d)
    if n < 2:
        return PairedDifference(n, mean, math.nan, math.nan, confidence)
    sd = statistics.stdev(d)
    return PairedDifference(n, mean, sd, t_quantile(confidence, n - 1) * sd / math.sqrt(n), confidence)


def mean_interval(values, confidence: float = 0.95) -> PairedDifference:
    """Mean of ``values`` and its Student-t interval (the one-sample case: differences from 0)."""
    return paired_difference([0.0] * len(values), values, confidence)
