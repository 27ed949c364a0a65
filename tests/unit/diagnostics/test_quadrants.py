"""The probability × entropy quadrants of positive-advantage tokens and the exact logit-gradient norm
(``stapo_verl.diagnostics.quadrants``): closed forms on hand-made distributions, autograd, and the S2T mask itself."""

import math

import pytest
import torch
from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits, entropy_from_logits

from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.diagnostics.quadrants import QUADRANTS, exact_logit_grad_norm_sq, quadrant_masks, quadrant_table
from stapo_verl.diagnostics.stats import logit_grad_norm_sq_bounds


def test_exact_norm_closed_form_on_a_dyadic_distribution():
    # π = (1/2, 1/4, 1/8, 1/8), y = 0: 1 − 2·(1/2) + (1/4 + 1/16 + 1/64 + 1/64) = 11/32
    pi = torch.tensor([0.5, 0.25, 0.125, 0.125], dtype=torch.float64)
    sum_sq = calculate_sum_pi_squared_from_logits(pi.log())
    assert float(sum_sq) == pytest.approx(0.34375, abs=1e-15)
    assert float(exact_logit_grad_norm_sq(pi[0].log(), sum_sq)) == pytest.approx(11 / 32, abs=1e-15)
    # y = 3 with weight w = 2: w² (1 − 1/4 + 11/32) = 4 · 35/32
    w = torch.tensor(2.0, dtype=torch.float64)
    assert float(exact_logit_grad_norm_sq(pi[3].log(), sum_sq, w)) == pytest.approx(35 / 8, abs=1e-14)


def test_exact_norm_equals_autograd_of_the_pg_term():
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 11, generator=g, dtype=torch.float64) * 2.5).requires_grad_(True)
    y = torch.randint(0, 11, (6,), generator=g)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    log_prob = torch.log_softmax(logits, -1).gather(-1, y[:, None]).squeeze(-1)
    (w * log_prob).sum().backward()  # each row's logits only get their own token's gradient
    brute = logits.grad.square().sum(-1)
    exact = exact_logit_grad_norm_sq(log_prob.detach(), calculate_sum_pi_squared_from_logits(logits.detach()), w)
    torch.testing.assert_close(exact, brute, rtol=1e-12, atol=1e-14)
    lower, upper = logit_grad_norm_sq_bounds(log_prob.detach(), entropy_from_logits(logits.detach()), w, 11)
    assert bool((lower <= exact + 1e-12).all()) and bool((exact <= upper + 1e-12).all())


def test_exact_norm_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        exact_logit_grad_norm_sq(torch.zeros(3), torch.zeros(4))


def _batch():
    """Two responses of 4 tokens; row 0 has Â = +1, row 1 Â = −1; the last token of row 1 is padding."""
    p = torch.tensor([[0.01, 0.05, 0.5, 0.9], [0.01, 0.02, 0.6, 0.3]], dtype=torch.float64)
    h = torch.tensor([[0.2, 1.0, 0.3, 2.0], [0.1, 0.1, 0.5, 0.7]], dtype=torch.float64)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    sum_sq = torch.tensor([[0.9, 0.5, 0.4, 0.82], [0.9, 0.9, 0.5, 0.3]], dtype=torch.float64)
    return {"log_prob": p.log(), "entropy": h, "advantages": adv, "response_mask": mask, "sum_pi_squared": sum_sq}


def test_quadrants_use_the_masks_thresholds_and_low_low_is_what_s2t_silences():
    b = _batch()
    masks, tau_h = quadrant_masks(b["log_prob"], b["entropy"], b["advantages"], b["response_mask"], 0.1, 0.5)
    # candidates P (Â > 0, p < 0.1): row 0 tokens 0, 1 with H 0.2, 1.0 -> τ_h = median = 0.6
    assert tau_h == pytest.approx(0.6, abs=1e-7)
    as_list = {k: v.nonzero().tolist() for k, v in masks.items()}
    assert as_list == {("low", "low"): [[0, 0]], ("low", "high"): [[0, 1]], ("high", "low"): [[0, 2]],
                       ("high", "high"): [[0, 3]]}
    keep, _ = s2t_keep_mask(b["log_prob"], b["entropy"], b["advantages"], b["response_mask"], tau_p=0.1, q=0.5)
    assert torch.equal(masks[("low", "low")], b["response_mask"] & ~keep)


def test_quadrant_table_means_and_excess():
    b = _batch()
    t = quadrant_table([b, b], tau_p=0.1, q=0.5, vocab_size=368)
    assert t.n_positive == 8 and t.tau_h == pytest.approx((0.6, 0.6))
    ll, hh = t.quadrants[("low", "low")], t.quadrants[("high", "high")]
    assert ll.count == 2 and hh.count == 2
    assert ll.norm_mean == pytest.approx(math.sqrt(1 - 0.02 + 0.9), abs=1e-12)
    assert hh.norm_mean == pytest.approx(math.sqrt(1 - 1.8 + 0.82), abs=1e-12)
    assert ll.p_mean == pytest.approx(0.01) and ll.entropy_mean == pytest.approx(0.2)
    assert ll.weighted_norm_mean == pytest.approx(ll.norm_mean)  # |Â| = 1
    assert ll.lower_mean == pytest.approx(math.sqrt(1 - 0.02 + math.exp(-0.2)), abs=1e-12)
    c_v = 367 / (368 * math.log(368) ** 2)
    assert ll.upper_mean == pytest.approx(math.sqrt(2 - 0.02 - c_v * 0.04), abs=1e-12)
    assert t.excess() == pytest.approx(math.sqrt(1.88) / math.sqrt(0.02) - 1, rel=1e-9)
    assert set(t.quadrants) == set(QUADRANTS)


def test_quadrant_table_without_candidates_or_batches():
    b = _batch()
    t = quadrant_table([b], tau_p=0.001, q=0.75)  # no p < 0.001: no τ_h, nothing low-p
    assert t.tau_h[0] != t.tau_h[0]  # NaN
    assert t.quadrants[("low", "low")].count == 0 and math.isnan(t.quadrants[("low", "low")].norm_mean)
    assert t.quadrants[("high", "high")].count == 4 and math.isnan(t.excess())
    assert math.isnan(t.quadrants[("high", "high")].upper_mean)  # no |V|
    with pytest.raises(ValueError, match="at least one batch"):
        quadrant_table([], tau_p=0.1, q=0.75)
    with pytest.raises(ValueError, match="quantile"):
        quadrant_masks(b["log_prob"], b["entropy"], b["advantages"], b["response_mask"], 0.1, 1.5)
