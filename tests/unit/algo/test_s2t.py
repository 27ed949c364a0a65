"""Closed-form checks of the S2T mask (STAPO paper §3): candidates, τ_h interpolation, ties, counts, ablations."""

import math

import pytest
import torch

from stapo_verl.algo.s2t import candidate_mask, s2t_keep_mask
from stapo_verl.algo.selections import (
    full_selection,
    high_entropy_selection,
    mask_seed,
    random_selection,
    s2t_ablation_keep_mask,
    top_entropy_keep_mask,
)

P = "actor/stapo/"


def _row(p, h, adv=1.0, valid=None):
    lp = torch.log(torch.tensor([p], dtype=torch.float64))
    ent = torch.tensor([h], dtype=torch.float64)
    a = torch.full_like(ent, adv)
    rm = torch.ones_like(ent, dtype=torch.bool) if valid is None else torch.tensor([valid], dtype=torch.bool)
    return lp, ent, a, rm


def test_hand_computed_mask_and_tau_h_interpolation():
    # candidates (p < 0.002): H = 0.5, 0.1, 0.9 -> sorted [0.1, 0.5, 0.9]; q=0.75 at position 1.5 -> 0.7
    lp, ent, adv, rm = _row([0.001, 0.5, 0.0001, 0.001, 0.0019], [0.5, 0.05, 0.1, 0.9, 0.95])
    keep, m = s2t_keep_mask(lp[:, :4], ent[:, :4], adv[:, :4], rm[:, :4])
    assert m[P + "tau_h"] == pytest.approx(0.7)
    assert keep.tolist() == [[False, True, False, True]]
    assert (m[P + "num_candidates"], m[P + "num_masked"], m[P + "nonfinite_tokens"]) == (3, 2, 0)
    assert m[P + "masked_frac"] == pytest.approx(2 / 4) and m[P + "renorm_factor"] == pytest.approx(4 / 2)
    keys = "masked_frac candidate_frac num_masked num_candidates nonfinite_tokens renorm_factor tau_h".split()
    assert set(m) == {P + k for k in keys}  # exactly these metrics
    # 4 candidates [0.1, 0.5, 0.9, 0.95]: position 2.25 -> 0.9 + 0.25 * 0.05 = 0.9125; strictly below: 3 masked
    keep, m = s2t_keep_mask(lp, ent, adv, rm)
    assert m[P + "tau_h"] == pytest.approx(0.9125)
    assert keep.tolist() == [[False, True, False, False, True]]
    assert m["actor/stapo/masked_frac"] == pytest.approx(3 / 5)
    assert m["actor/stapo/candidate_frac"] == pytest.approx(4 / 5)
    assert m["actor/stapo/renorm_factor"] == pytest.approx(5 / 2)


def test_strict_thresholds_and_ties_kept():
    tau = 0.002
    # p exactly tau_p is not a candidate (strict <); ties at tau_h are kept (strict <).
    lp, ent, adv, rm = _row([tau, 0.001, 0.001, 0.001], [0.1, 0.3, 0.3, 0.3])
    keep, m = s2t_keep_mask(lp, ent, adv, rm, tau_p=tau)
    assert m[P + "num_candidates"] == 3 and m[P + "tau_h"] == pytest.approx(0.3)
    assert m[P + "num_masked"] == 0 and keep.all()
    # zero advantage (all-correct group) and negative advantage are never candidates
    for a in (0.0, -1.0):
        lp, ent, adv, rm = _row([0.001] * 3, [0.1, 0.2, 0.3], adv=a)
        keep, m = s2t_keep_mask(lp, ent, adv, rm)
        assert m[P + "num_candidates"] == 0 and P + "tau_h" not in m and keep.all()


@pytest.mark.parametrize("n,expected", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3), (5, 3), (100, 75)])
def test_silenced_count_table(n, expected):
    # with n distinct values, strict < at the linear quantile (position q (n-1)) silences ceil(q (n-1)).
    assert expected == (math.ceil(0.75 * (n - 1)) if n else 0)
    h = torch.linspace(0.01, 1.0, max(n, 1), dtype=torch.float64)[:n].flip(0)  # distinct, unsorted
    lp = torch.full((1, n), math.log(0.001), dtype=torch.float64)
    keep, m = s2t_keep_mask(lp, h[None], torch.ones(1, n), torch.ones(1, n, dtype=torch.bool))
    assert m[P + "num_masked"] == expected == int((~keep).sum())


def test_padding_and_nonfinite_never_selected():
    # padding positions look like perfect spurious tokens (p≈0, H=0) but response_mask=0
    lp, ent, adv, rm = _row([1e-6, 1e-6, 0.001, 0.001], [0.0, 0.0, 0.2, 0.4], valid=[1, 1, 0, 0])
    lp[0, 0] = float("nan")
    ent[0, 1] = float("inf")
    keep, m = s2t_keep_mask(lp, ent, adv, rm)
    assert m[P + "num_candidates"] == 0 and m[P + "nonfinite_tokens"] == 2 and m[P + "renorm_factor"] == 2 / 1
    assert keep.tolist() == [[False, False, False, False]]
    cand, nonfinite = candidate_mask(lp, ent, adv, rm, 0.002)
    assert not cand.any() and nonfinite.tolist() == [[True, True, False, False]]


def test_q_one_and_small_q():
    lp, ent, adv, rm = _row([0.001] * 4, [0.1, 0.2, 0.3, 0.4])
    keep, m = s2t_keep_mask(lp, ent, adv, rm, q=1.0)  # tau_h = max -> all but the max
    assert m[P + "num_masked"] == 3
    keep, m = s2t_keep_mask(lp, ent, adv, rm, q=1e-9)  # tau_h ~= min -> nothing strictly below
    assert m[P + "num_masked"] == 0


def test_ablation_modes_counts_and_members():
    h = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]], dtype=torch.float64)
    lp = torch.full_like(h, math.log(0.001))
    adv, rm = torch.ones_like(h), torch.ones_like(h, dtype=torch.bool)
    keep_low, m_low = s2t_keep_mask(lp, h, adv, rm)  # tau 0.4 -> masks 0.1..0.3
    keep_high, m_high = s2t_ablation_keep_mask(lp, h, adv, rm, tau_p=0.002, select=high_entropy_selection(0.75))
    keep_full, m_full = s2t_ablation_keep_mask(lp, h, adv, rm, tau_p=0.002, select=full_selection())
    assert keep_low.tolist() == [[False, False, False, True, True]]
    assert keep_high.tolist() == [[True, True, False, False, False]]  # tau(0.25) = 0.2, H > 0.2 silenced
    assert m_high[P + "tau_h"] == pytest.approx(0.2) and m_high.keys() == m_low.keys()  # the S2T mask's metrics
    assert m_full[P + "num_masked"] == 5 and not keep_full.any() and P + "tau_h" not in m_full
    masks = set()
    for seed in range(20):
        keep_r, m_r = s2t_ablation_keep_mask(lp, h, adv, rm, tau_p=0.002, select=random_selection(0.75, seed))
        assert m_r[P + "num_masked"] == 3 == int((~keep_r).sum())
        masks.add(tuple(keep_r.flatten().tolist()))
        again, _ = s2t_ablation_keep_mask(lp, h, adv, rm, tau_p=0.002, select=random_selection(0.75, seed))
        assert torch.equal(again, keep_r)  # deterministic per seed (identical on every DP rank)
    assert len(masks) > 3  # actually random across seeds


def test_mask_seed_is_a_function_of_the_position_in_training():
    assert mask_seed(7, 3, 1) == mask_seed(7, 3, 1)
    seeds = {mask_seed(s, step, mb) for s in (0, 7) for step in range(5) for mb in range(4)}
    assert len(seeds) == 2 * 5 * 4  # distinct per (seed, step, mini-batch)
    with pytest.raises(ValueError, match="must be >= 0"):
        mask_seed(0, -1, 0)


def test_tau_h_is_torch_quantile_of_the_candidates():
    g = torch.Generator().manual_seed(0)
    h = torch.rand(1, 1001, generator=g, dtype=torch.float64)
    lp = torch.full_like(h, math.log(0.001))
    keep, m = s2t_keep_mask(lp, h, torch.ones_like(h), torch.ones_like(h, dtype=torch.bool))
    tau = torch.quantile(h[0].float(), 0.75, interpolation="linear")
    assert m[P + "tau_h"] == float(tau) and torch.equal(~keep[0], h[0].float() < tau)


def test_top_entropy_keep_mask_official_rule():
    h = torch.tensor([[0.5, 2.0, 0.1, 1.0], [3.0, 0.2, 0.0, 0.0]])
    rm = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    keep, m = top_entropy_keep_mask(h, rm, 0.2)  # N=6 -> k = int(6*0.2 + 0.9999) = 2
    assert keep.tolist() == [[False, True, False, False], [True, False, False, False]]
    assert m == {"actor/top_entropy/kept_frac": 2 / 6, "actor/top_entropy/threshold": 2.0}
    keep, _ = top_entropy_keep_mask(h, rm, 0.5)  # k=3
    assert keep.tolist() == [[False, True, False, True], [True, False, False, False]]
    keep, m = top_entropy_keep_mask(h, torch.zeros_like(rm), 0.2)
    assert not keep.any() and m == {"actor/top_entropy/kept_frac": 0.0}
    # the config's one range of top_entropy_ratio, with the config's message
    with pytest.raises(ValueError, match=r"top_entropy_ratio=0\.0 is out of range: allowed 0 < top_entropy_ratio <= 1"):
        top_entropy_keep_mask(h, rm, 0.0)


def test_shape_mismatch_is_clear():
    with pytest.raises(ValueError, match="shape"):
        s2t_keep_mask(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))


def test_quantile_linear_is_torch_quantile_where_both_run_and_has_no_size_limit():
    from stapo_verl.algo.selections import TORCH_QUANTILE_MAX_NUMEL, quantile_linear

    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 5, 1001, 4096):
        for dtype in (torch.float32, torch.float64):
            v = torch.randn(n, generator=g, dtype=dtype)
            qs = [0.0, 0.25, 0.5, 0.75, 0.95, 1.0, 1 / 3]
            assert torch.equal(quantile_linear(v, qs), torch.quantile(v, torch.tensor(qs, dtype=dtype)))
            assert torch.equal(quantile_linear(v, 0.75), torch.quantile(v, 0.75))
    n = TORCH_QUANTILE_MAX_NUMEL + 3
    v = torch.randperm(n, generator=g).double()  # 0 .. n-1, shuffled: Quantile_q = q (n - 1) exactly
    with pytest.raises(RuntimeError):
        torch.quantile(v, 0.75)
    assert quantile_linear(v, [0.75, 0.5, 1.0]).tolist() == [0.75 * (n - 1), 0.5 * (n - 1), n - 1]
    with pytest.raises(ValueError, match="non-empty 1-d"):
        quantile_linear(v[:0], 0.5)


def test_the_s2t_pre_pass_host_syncs_on_the_old_policy_route(monkeypatch):
    """The host reads of one S2T pre-pass from the mask's code (Tensor.item/.cpu/.tolist/.numpy and int()/float()/
    bool()/index of a tensor, called from stapo_verl): the group's counts (the sizes of the candidates' exchange),
    the metrics, and the kept count (verl's engines read batch_num_tokens the same way). verl's
    ``response_to_nested`` also indexes the response lengths row by row, on the CPU where the mini-batch arrives."""
    import sys

    from stapo_verl.core.losses import apply_policy_token_mask
    from support.verl_batches import actor_config, random_minibatch

    b = random_minibatch(bs=8, seed=2)
    cfg = actor_config("stapo", s2t_tau_p=0.5)
    calls = []
    for name in ("item", "cpu", "tolist", "numpy", "__int__", "__float__", "__bool__", "__index__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            caller = sys._getframe(1).f_code
            if "stapo_verl" in caller.co_filename:
                calls.append((_name, caller.co_name))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    metrics = apply_policy_token_mask(cfg, b["td"])
    monkeypatch.undo()
    assert metrics["actor/stapo/num_masked"] > 0  # the mask did silence tokens
    assert calls == [("tolist", "gather_candidates"), ("tolist", "s2t_metrics"), ("item", "apply_policy_token_mask")]
