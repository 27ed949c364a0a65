"""The paper's probability × entropy quadrants of positive-advantage tokens, with exact logit-gradient norms.

STAPO (arXiv 2602.15620) §3 splits the positive-advantage tokens of a batch into four quadrants, probability
low / high × entropy low / high, and compares the norm of the policy-gradient term's gradient with respect to each
token's logits between them (v1, figure 2b: the low-probability, low-entropy quadrant carries a larger mean norm
than the high-probability, high-entropy one). Here the thresholds are the S2T mask's own
(:mod:`stapo_verl.algo.s2t`): a token is *low-p* iff p < τ_p (evaluated as log p < ln τ_p) and *low-H* iff
H < τ_h, τ_h = Quantile_q of the entropies of the candidates P = {valid, finite, Â > 0, p < τ_p} (linear
interpolation, ``torch.quantile`` in float32, as :func:`stapo_verl.algo.s2t.s2t_keep_mask` takes it). The low-p /
low-H quadrant is therefore exactly the set the S2T mask silences.

For a sampled token y with probability p, next-token distribution π and PG weight w, ∇_a (w log p) = w (e_y − π),
so the EXACT squared norm is w² (1 − 2p + Σ_v π_v²) (:func:`exact_logit_grad_norm_sq`; Σ π² from the full
distribution, e.g. verl's ``calculate_sum_pi_squared_from_logits``), and Theorem 3.1 bounds it from p and H alone
(:func:`stapo_verl.diagnostics.stats.logit_grad_norm_sq_bounds`).

Pure torch; no distributed code (the benchmark holds the whole batch in one process).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stapo_verl.algo.s2t import candidate_mask
from stapo_verl.algo.config_ranges import check_range
from stapo_verl.algo.selections import quantile_linear
from stapo_verl.diagnostics.stats import logit_grad_norm_sq_bounds

#: the four quadrants in the order they are reported: (probability, entropy)
QUADRANTS = (("low", "low"), ("low", "high"), ("high", "low"), ("high", "high"))


def exact_logit_grad_norm_sq(log_prob: torch.Tensor, sum_pi_squared: torch.Tensor,
                             weight: torch.Tensor | None = None) -> torch.Tensor:
    """||∇_a (w log p)||² = w² (1 − 2p + Σ_v π_v²), the exact squared norm of one token's PG logit gradient.

    Args:
        log_prob: (...) float, log p of the sampled token.
        sum_pi_squared: (...) float, Σ_v π_v² of the same next-token distribution (verl's
            ``verl.utils.torch_functional.calculate_sum_pi_squared_from_logits``).
        weight: (...) float, the token's weight w in the PG term; None means w = 1.

    Returns:
        (...) tensor in the inputs' float dtype promoted to at least float32, clamped at 0 (1 − 2p + Σ π² ≥ 0
        holds exactly; the clamp absorbs rounding when p → 1).

    Raises:
        ValueError: the shapes differ.

    Source: the logit-gradient identity of STAPO (arXiv 2602.15620) §3 / appendix, after Yang et al. 2025
    (arXiv 2505.12929): ∂ log softmax(a)_y / ∂a = e_y − softmax(a).
    """
    tensors = (log_prob, sum_pi_squared) if weight is None else (log_prob, sum_pi_squared, weight)
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"exact_logit_grad_norm_sq needs one shape for its inputs, got {sorted(shapes)}")
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, sum_pi_squared.dtype), torch.float32)
    p = log_prob.detach().to(dtype).exp()
    norm_sq = (1.0 - 2.0 * p + sum_pi_squared.detach().to(dtype)).clamp_min(0.0)
    if weight is not None:
        norm_sq = norm_sq * weight.detach().to(dtype).square()
    return norm_sq


@dataclass(frozen=True)
class QuadrantStats:
    """One quadrant of the positive-advantage tokens; every mean is over its tokens (NaN when it is empty).

    Attributes:
        count: tokens in the quadrant.
        p_mean: mean sampled-token probability.
        entropy_mean: mean entropy (nats).
        norm_mean: mean EXACT ||∇_a log p|| = sqrt(1 − 2p + Σ π²) (unit weight: per unit of advantage).
        lower_mean, upper_mean: mean of the square roots of Theorem 3.1's lower and upper bounds at unit weight
            (bounds on the norm, so ``lower_mean ≤ norm_mean ≤ upper_mean``); ``upper_mean`` is NaN without |V|.
        weighted_norm_mean: mean exact norm with the token's advantage as its weight, |Â| · sqrt(1 − 2p + Σ π²)
            (under ``token-mean`` every token's PG weight is Â / N with one N for the batch).
    """

    count: int
    p_mean: float
    entropy_mean: float
    norm_mean: float
    lower_mean: float
    upper_mean: float
    weighted_norm_mean: float


@dataclass(frozen=True)
class QuadrantTable:
    """The four quadrants of one population of positive-advantage tokens.

    Attributes:
        quadrants: (probability, entropy) → :class:`QuadrantStats`, keys as in :data:`QUADRANTS`.
        tau_p: τ_p.
        tau_h: τ_h of each batch the tokens came from (one per :func:`quadrant_table` call merged in).
        n_positive: positive-advantage tokens (valid, finite p and H, Â > 0) = Σ counts.
    """

    quadrants: dict
    tau_p: float
    tau_h: tuple[float, ...]
    n_positive: int

    def excess(self, numerator=("low", "low"), denominator=("high", "high")) -> float:
        """norm_mean(numerator) / norm_mean(denominator) − 1 (the paper's figure 2b compares low-p/low-H with
        high-p/high-H); NaN when either quadrant is empty or the denominator's mean is 0."""
        num, den = self.quadrants[numerator].norm_mean, self.quadrants[denominator].norm_mean
        return num / den - 1.0 if math.isfinite(num) and math.isfinite(den) and den > 0 else math.nan


def quadrant_masks(log_prob: torch.Tensor, entropy: torch.Tensor, advantages: torch.Tensor,
                   response_mask: torch.Tensor, tau_p: float, q: float) -> tuple[dict, float | None]:
    """The four quadrants of one batch's positive-advantage tokens, with the S2T mask's thresholds.

    Args:
        log_prob: (bs, T) float, log p of the sampled token.
        entropy: (bs, T) float, H in nats.
        advantages: (bs, T) float, Â.
        response_mask: (bs, T) bool or int.
        tau_p: τ_p in (0, 1) (p < τ_p is low).
        q: the entropy quantile (``policy_loss.s2t_entropy_quantile``, 0 < q <= 1); τ_h = Quantile_q(H over P).

    Returns:
        ``(masks, tau_h)``: ``masks`` maps each key of :data:`QUADRANTS` to a (bs, T) bool tensor; τ_h is None
        when P is empty, and then every positive-advantage token counts as high-entropy.

    Raises:
        ValueError: the shapes differ (:func:`stapo_verl.algo.s2t.candidate_mask`).
        stapo_verl.algo.config_ranges.StapoConfigError (a ValueError): ``tau_p`` or ``q`` is outside the config's
            range of ``tau_p`` / ``entropy_quantile``.
    """
    check_range("s2t_tau_p", tau_p)
    check_range("s2t_entropy_quantile", q)
    cand, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    ent = entropy.detach().float()
    valid = response_mask.bool() & ~nonfinite
    positive = valid & (torch.nan_to_num(advantages.detach().float(), nan=0.0) > 0)
    tau_h = float(quantile_linear(ent[cand], q)) if bool(cand.any()) else None  # as the mask: linear, fp32
    low_p = cand  # = positive & (log p < ln τ_p)
    low_h = ent < tau_h if tau_h is not None else torch.zeros_like(positive)
    masks = {}
    for prob, ent_level in QUADRANTS:
        in_p = low_p if prob == "low" else positive & ~low_p
        masks[(prob, ent_level)] = in_p & (low_h if ent_level == "low" else ~low_h)
    return masks, tau_h


def quadrant_table(batches, *, tau_p: float, q: float, vocab_size: int | None = None) -> QuadrantTable:
    """The quadrant table over the positive-advantage tokens of one or more batches (τ_h taken per batch, as the
    mask takes it per optimizer mini-batch).

    Args:
        batches: iterable of dicts with (bs, T) tensors ``log_prob``, ``entropy``, ``sum_pi_squared`` (Σ π² of the
            full next-token distribution), ``advantages``, ``response_mask``.
        tau_p, q: the mask's τ_p and entropy quantile.
        vocab_size: |V| for Theorem 3.1's upper bound (None: no upper bound, ``upper_mean`` NaN).

    Returns:
        :class:`QuadrantTable`; means accumulate in float64.

    Raises:
        ValueError: no batch, or a batch whose shapes differ.
    """
    sums = {key: torch.zeros(7, dtype=torch.float64) for key in QUADRANTS}
    tau_hs = []
    seen = False
    for b in batches:
        seen = True
        masks, tau_h = quadrant_masks(b["log_prob"], b["entropy"], b["advantages"], b["response_mask"], tau_p, q)
        tau_hs.append(math.nan if tau_h is None else tau_h)
        unit = torch.ones_like(b["log_prob"], dtype=torch.float64)
        exact = exact_logit_grad_norm_sq(b["log_prob"].double(), b["sum_pi_squared"].double()).sqrt()
        lower, upper = logit_grad_norm_sq_bounds(b["log_prob"].double(), b["entropy"].double(), unit, vocab_size)
        upper = upper.sqrt() if upper is not None else torch.full_like(exact, math.nan)
        adv = b["advantages"].detach().double().abs()
        cols = torch.stack([torch.ones_like(exact), b["log_prob"].detach().double().exp(),
                            b["entropy"].detach().double(), exact, lower.sqrt(), upper, adv * exact], dim=-1)
        for key, m in masks.items():
            sums[key] += cols[m].sum(0)
    if not seen:
        raise ValueError("quadrant_table needs at least one batch")
    quadrants = {}
    for key, s in sums.items():
        n = int(s[0])
        means = (s[1:] / n).tolist() if n else [math.nan] * 6
        quadrants[key] = QuadrantStats(n, *means)
    return QuadrantTable(quadrants=quadrants, tau_p=tau_p, tau_h=tuple(tau_hs),
                         n_positive=sum(v.count for v in quadrants.values()))
