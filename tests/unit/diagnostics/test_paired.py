"""Paired confidence intervals (``stapo_verl.diagnostics.paired``) against closed forms and published t tables."""

import math
import statistics

import pytest

from stapo_verl.diagnostics.paired import (
    mean_interval,
    paired_difference,
    t_quantile,
)


def test_t_quantile_closed_forms_for_one_and_two_degrees_of_freedom():
    # ν = 1 (Cauchy): t = tan(π (p − 1/2)); ν = 2: t = (2p − 1) / sqrt(2 p (1 − p)); p = 0.975
    assert t_quantile(0.95, 1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    assert t_quantile(0.95, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-12)
    assert t_quantile(0.90, 2) == pytest.approx(0.9 / math.sqrt(2 * 0.95 * 0.05), rel=1e-12)


@pytest.mark.parametrize("df, expected", [(3, 3.182446305284263), (4, 2.7764451051977987), (5, 2.570581835636314),
                                          (9, 2.2621571627409915), (29, 2.045229642132703),
                                          (100, 1.9839715184496334)])
def test_t_quantile_matches_the_t_table(df, expected):
    # published two-sided 95 % t-table values
    assert t_quantile(0.95, df) == pytest.approx(expected, rel=1e-10)


def test_t_quantile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="integer >= 1"):
        t_quantile(0.95, 0)
    with pytest.raises(ValueError, match="integer >= 1"):
        t_quantile(0.95, 2.5)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        t_quantile(1.0, 4)


def test_paired_difference_on_hand_made_values():
    a = [0.70, 0.72, 0.65, 0.74, 0.69]
    b = [0.74, 0.73, 0.70, 0.76, 0.70]
    d = [y - x for x, y in zip(a, b)]
    r = paired_difference(a, b)
    assert r.n == 5
    assert r.mean == pytest.approx(statistics.fmean(d), abs=1e-15)
    assert r.sd == pytest.approx(statistics.stdev(d), abs=1e-15)
    assert r.half_width == pytest.approx(2.7764451051977987 * statistics.stdev(d) / math.sqrt(5), rel=1e-10)
    assert r.low == pytest.approx(r.mean - r.half_width) and r.excludes_zero()
    assert r.format(3) == f"{r.mean:+.3f} [{r.low:+.3f}, {r.high:+.3f}]"


def test_paired_difference_drops_non_finite_pairs_and_small_samples():
    r = paired_difference([1.0, math.nan, 2.0], [1.5, 3.0, 2.1])
    assert r.n == 2 and r.mean == pytest.approx(0.3)
    assert r.half_width == pytest.approx(12.706204736174696 * statistics.stdev([0.5, 0.1]) / math.sqrt(2))
    one = paired_difference([1.0], [1.25])
    assert one.n == 1 and one.mean == 0.25 and math.isnan(one.half_width) and one.format(2) == "+0.25 (n=1)"
    assert paired_difference([], []).format() == "—"
    assert not paired_difference([0, 0, 0], [1, -1, 0]).excludes_zero()
    with pytest.raises(ValueError, match="equally long"):
        paired_difference([1.0], [1.0, 2.0])


def test_mean_interval_is_the_one_sample_t_interval():
    x = [3.0, 5.0, 4.0, 6.0]
    r = mean_interval(x)
    assert r.mean == 4.5
    assert r.half_width == pytest.approx(3.182446305284263 * statistics.stdev(x) / 2, rel=1e-10)
