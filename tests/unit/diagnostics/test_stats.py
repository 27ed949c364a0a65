"""Mask statistics (``stapo_verl.diagnostics.stats``): exact values on hand-built mini-batches, and the combination of
per-rank partials equal to one process holding the whole mini-batch."""

import math

import numpy as np
import pytest
import torch

from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.diagnostics import stats
from stapo_verl.diagnostics.stats import HISTOGRAMS, Histogram, combine, local_partials, mask_statistics

TAU_P = 0.01


def _batch(seed=0, bs=6, T=30):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(10, T + 1, (bs,), generator=g)
    rm = (torch.arange(T)[None, :] < lens[:, None]).long()
    lp = -torch.rand(bs, T, generator=g) * 2
    pick = torch.rand(bs, T, generator=g) < 0.3
    lp = torch.where(pick, math.log(1e-3) - 3 * torch.rand(bs, T, generator=g), lp)  # p in (5e-5, 1e-3) < τ_p
    ent = torch.rand(bs, T, generator=g) * 3
    adv = torch.tensor([1.0, -0.5, 0.7, 0.0, -1.2, 2.0])[:bs, None].expand(bs, T).contiguous()
    return lp, ent, adv, rm


def test_quantiles_fraction_buckets_and_histograms_are_exact():
    lp, ent, adv, rm = _batch()
    keep, s2t = s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=0.75)
    st = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P)
    valid = rm.bool()
    cand = valid & (adv > 0) & (lp < math.log(TAU_P))
    neg = valid & (adv < 0) & (lp < math.log(TAU_P))
    assert st.n_candidates == s2t["actor/stapo/num_candidates"] == int(cand.sum()) > 10
    assert st.n_positive == int((valid & (adv > 0)).sum())
    m = st.to_metrics()
    ref = np.quantile(ent[cand].double().numpy(), [0.5, 0.75, 0.95])  # numpy's default is linear interpolation
    for q, v in zip((50, 75, 95), ref, strict=True):
        assert m[f"actor/stapo/candidate_entropy_p{q}"] == pytest.approx(v, rel=1e-6)
    # q = 0.75: the p75 is τ_h
    assert m["actor/stapo/candidate_entropy_p75"] == pytest.approx(s2t["actor/stapo/tau_h"])
    assert m["actor/stapo/pos_adv_below_tau_p_frac"] == pytest.approx(int(cand.sum()) / st.n_positive)
    # silenced tokens by third of their own response: ⌊3t / L⌋
    sil = (cand & ~keep).nonzero().tolist()
    lens = rm.sum(-1).tolist()
    want = [0, 0, 0]
    for i, t in sil:
        want[min(3 * t // lens[i], 2)] += 1
    assert list(st.silenced_by_position) == want and sum(want) == s2t["actor/stapo/num_masked"] > 0
    for name, n in zip(("begin", "middle", "end"), want, strict=True):
        assert m[f"actor/stapo/silenced_share_{name}"] == pytest.approx(n / sum(want))
    # histograms: numpy over the same values, out-of-range values clamped into the end bins
    h = st.histograms
    e_edges = np.array(stats.entropy_edges())
    assert list(h["entropy_adv_pos"].counts) == np.histogram(ent[cand].numpy(), e_edges)[0].tolist()
    assert list(h["entropy_adv_neg"].counts) == np.histogram(ent[neg].numpy(), e_edges)[0].tolist()
    p_edges = np.array(stats.log10_p_edges(TAU_P))
    lp10 = (lp / math.log(10)).double().numpy()
    assert list(h["log10_p_adv_pos"].counts) == np.histogram(lp10[cand.numpy()], p_edges)[0].tolist()
    assert h["log10_p_adv_neg"].num == int(neg.sum()) > 0
    assert h["entropy_adv_pos"].total == pytest.approx(float(ent[cand].double().sum()))
    assert h["entropy_adv_pos"].low == pytest.approx(float(ent[cand].min()))
    # no metric name contains min/max: verl's reduce_metrics would take the min/max over mini-batches instead
    assert not any("min" in k or "max" in k for k in m)


def test_two_ranks_combine_to_the_single_process_statistics():
    lp, ent, adv, rm = _batch(seed=3)
    keep, _ = s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=0.75)
    whole = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P)
    parts = [local_partials(lp[r], ent[r], adv[r], rm[r], keep[r], TAU_P) for r in (slice(0, 2), slice(2, 6))]
    split = combine(parts)
    assert split.to_metrics() == whole.to_metrics()
    for name in HISTOGRAMS:
        assert split.histograms[name].counts == whole.histograms[name].counts
        assert split.histograms[name].total == pytest.approx(whole.histograms[name].total)


def test_empty_population_logs_only_what_is_defined():
    bs, T = 2, 5
    lp = torch.full((bs, T), -0.1)  # p ≈ 0.9: no candidates
    st = mask_statistics(lp, torch.ones(bs, T), torch.ones(bs, T), torch.ones(bs, T), torch.ones(bs, T, dtype=bool),
                         tau_p=TAU_P)
    # nothing silenced: the silenced-gradient share is 0 (always logged; its upper twin needs |V|)
    assert st.to_metrics() == {"actor/stapo/pos_adv_below_tau_p_frac": 0.0, "actor/stapo/silenced_grad_share": 0.0}
    assert all(h.num == 0 for h in st.histograms.values())


def test_out_of_range_values_land_in_the_end_bins_and_edges_are_checked():
    h = Histogram.of(torch.tensor([-1.0, 0.5, 20.0]), (0.0, 1.0, 2.0))
    assert h.counts == (2, 1) and (h.low, h.high, h.num) == (-1.0, 20.0, 3)
    assert h.merge(Histogram.of(torch.tensor([1.5]), (0.0, 1.0, 2.0))).counts == (2, 2)
    with pytest.raises(ValueError, match="different bin edges"):
        h.merge(Histogram.of(torch.tensor([1.5]), (0.0, 2.0)))
    with pytest.raises(ValueError, match="tau_p"):
        stats.log10_p_edges(1.5)
    with pytest.raises(ValueError, match="one \\(batch, response_len\\) shape"):
        local_partials(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 4),
                       TAU_P)


def test_non_finite_statistics_are_not_candidates_as_in_the_mask():
    lp, ent, adv, rm = _batch(seed=5)
    lp[0, 0], lp[0, 1], ent[2, 0], lp[5, 2] = float("nan"), float("-inf"), float("inf"), float("nan")
    ent[0, 2] = float("nan")
    lp[0, 2] = -9.0  # low p, but its entropy is NaN
    keep, s2t = s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=0.75)
    st = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P)
    assert s2t["actor/stapo/nonfinite_tokens"] == 5
    assert st.n_candidates == s2t["actor/stapo/num_candidates"]
    assert sum(st.silenced_by_position) == s2t["actor/stapo/num_masked"]
    assert st.to_metrics()["actor/stapo/candidate_entropy_p75"] == pytest.approx(s2t["actor/stapo/tau_h"])


