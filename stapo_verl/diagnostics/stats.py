"""Mask statistics of one optimizer mini-batch, global over the data-parallel group (torch only).

What a user reads in the trackers under ``actor/stapo/`` besides the mask's own metrics
(``stapo_verl.algo.s2t.s2t_metrics``):

=====================================  ==========================================================================
``candidate_entropy_p50/p75/p95``      quantiles (linear interpolation, as τ_h) of H over the candidates P
                                       (valid, finite, Â > 0, p < τ_p); with ``entropy_quantile=0.75`` the p75
                                       *is* τ_h
``pos_adv_below_tau_p_frac``           |P| / #(valid tokens with Â > 0): how much of the positive-advantage
                                       signal sits below τ_p
``silenced_share_begin/middle/end``    share of the silenced tokens in the first, middle and last third of their
                                       response (position t of a response of length L is in third ⌊3t/L⌋)
``silenced_grad_share``, ``_upper``    share of the policy-gradient logit-norm² the silenced tokens carry,
                                       Σ_silenced bound / Σ_valid bound of Theorem 3.1's lower bound (``_upper``:
                                       its upper bound), with each token's weight in the PG term before masking
                                       (:func:`policy_gradient_weight`, :func:`logit_grad_norm_sq_bounds`)
histograms (not scalars)               H and log10 p of the low-probability tokens (valid, finite, p < τ_p),
                                       split by the sign of Â: ``entropy_adv_pos`` / ``entropy_adv_neg`` /
                                       ``log10_p_adv_pos`` / ``log10_p_adv_neg`` (Â > 0 is P itself)
=====================================  ==========================================================================

Cost: three O(tokens) passes (the indices of the valid tokens with p < τ_p, the count of positive-advantage tokens,
the gradient-norm bounds with their sums); everything else is O(low-probability tokens): the finiteness and sign
tests, the candidates' thirds, two fixed-bin ``histc`` per sign, the candidate entropies' quantiles.

In training the plugin's worker wrapper computes them after the mask, from the mask's keep, with
:func:`mask_statistics` (two tensor ``all_gather`` calls over the DP group on its device: each rank's histograms,
counts and bound sums in one fixed-size vector, then its candidates' entropies); the mask itself, which the upstream
series copies into verl, knows nothing of them. ``benchmarks/bench_diagnostics.py`` measures mask and statistics at
the production shape.

Source: STAPO (arXiv 2602.15620) §3 for P, τ_p and τ_h; the quantile is ``torch.quantile``'s linear interpolation
(:func:`stapo_verl.algo.selections.quantile_linear`, without its 2^24-element limit), the same as τ_h in
:func:`stapo_verl.algo.s2t.s2t_keep_mask` wherever the mask runs (it raises above 2^24 candidates); Theorem 3.1 of
the paper (after Yang et al. 2025, arXiv 2505.12929) for the gradient-norm bounds; verl's ``agg_loss`` (``verl.trainer.ppo.core_algos``) for the per-token weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stapo_verl.algo.config_ranges import check_range
from stapo_verl.algo.s2t import below_tau_p
from stapo_verl.algo.selections import quantile_linear

#: quantiles of the candidates' entropy logged as ``candidate_entropy_p<100·q>``
QUANTILES = (0.5, 0.75, 0.95)
#: thirds of a response, in order
POSITION_BUCKETS = ("begin", "middle", "end")
#: entropy histogram range in nats and bin count (0.25-nat bins; ln 151,936 = 11.93 for Qwen3's vocabulary; values
#: above the range are counted in the last bin, the exact maximum is kept)
ENTROPY_RANGE = (0.0, 12.0)
ENTROPY_BINS = 48
#: lower end of the log10 p histogram (the upper end is log10 τ_p), lowered to
#: log10 τ_p − :data:`LOG10_P_MIN_DECADES` for τ_p < 1e-11; lower values are counted in the first bin
LOG10_P_LOW = -12.0
#: the fewest decades the log10 p histogram spans
LOG10_P_MIN_DECADES = 1.0
LOG10_P_BINS = 40
#: histogram names, in the order they are logged
HISTOGRAMS = ("entropy_adv_pos", "entropy_adv_neg", "log10_p_adv_pos", "log10_p_adv_neg")
#: verl 0.9.1's ``loss_agg_mode`` values (``agg_loss``) whose PG weight is the same constant for every token of the
#: mini-batch: 1/Σ valid (``token-mean``), 1 (``token-sum``), 1/#responses (``seq-mean-token-sum``), that divided by
#: the scale factor (``seq-mean-token-sum-norm``); a constant cancels in a share
UNIFORM_WEIGHT_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm")
#: the mode whose PG weight is 1/(#responses · L_i), L_i = valid tokens of response i
PER_RESPONSE_MEAN_AGG_MODE = "seq-mean-token-mean"


def entropy_edges() -> tuple[float, ...]:
    """The ``ENTROPY_BINS + 1`` entropy bin edges over :data:`ENTROPY_RANGE` (nats)."""
    lo, hi = ENTROPY_RANGE
    return tuple(lo + (hi - lo) * i / ENTROPY_BINS for i in range(ENTROPY_BINS + 1))


def log10_p_edges(tau_p: float) -> tuple[float, ...]:
    """The ``LOG10_P_BINS + 1`` log10 p bin edges from min(:data:`LOG10_P_LOW`, log10 τ_p −
    :data:`LOG10_P_MIN_DECADES`) to log10 τ_p: every τ_p the config accepts has a histogram (the paper's 0.002:
    −12 to −2.70; τ_p = 1e-13: −14 to −13).

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError (a ValueError): τ_p is outside the config's range of
            ``policy_loss.s2t_tau_p`` (0 < τ_p < 1).
    """
    hi = math.log10(check_range("s2t_tau_p", tau_p))
    lo = min(LOG10_P_LOW, hi - LOG10_P_MIN_DECADES)
    return tuple(lo + (hi - lo) * i / LOG10_P_BINS for i in range(LOG10_P_BINS + 1))


def is_vocab_size(value) -> bool:
    """True for a usable vocabulary size |V|: an integer ≥ 2 (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 2


def logit_vocab_constant(vocab_size: int) -> float:
    """C_V = (|V| − 1) / (|V| (ln |V|)²), the constant of Theorem 3.1's upper bound.

    Raises:
        ValueError: ``vocab_size`` is not an integer ≥ 2 (:func:`is_vocab_size`).

    Source: STAPO (arXiv 2602.15620) Theorem 3.1, after Yang et al. 2025 (arXiv 2505.12929).
    """
    if not is_vocab_size(vocab_size):
        raise ValueError(f"vocab_size={vocab_size!r}: the vocabulary size |V| must be an integer >= 2")
    return (vocab_size - 1) / (vocab_size * math.log(vocab_size) ** 2)


def logit_grad_norm_sq_bounds(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    weight: torch.Tensor,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Theorem 3.1's bounds on ||∇_a J||², the squared norm of one token's PG term's gradient w.r.t. its logits a.

    For a sampled token of probability p, entropy H (nats) of its next-token distribution over |V| entries and
    weight w in the PG term, ∇_a (w log p) = w (e_y − π), so ||∇_a J||² = w² (1 − 2p + Σ_v π_v²), and

        w² (1 − 2p + e^{−H})  ≤  ||∇_a J||²  ≤  w² (2 − 2p − C_V H²),   C_V = (|V| − 1) / (|V| (ln |V|)²).

    Both are clamped at 0 (still bounds: the norm is ≥ 0). The lower bound is negative for some confident tokens
    (p = 0.9 beside one token of 0.1: 1 − 1.8 + e^{−0.325} = −0.0775); the clamp keeps every term of a share ≥ 0.

    Args:
        log_prob: (...) float, log p of the sampled token.
        entropy: (...) float, H in nats, same shape.
        weight: (...) float, the token's weight w in the PG term, same shape.
        vocab_size: |V|, the width of the logits the softmax runs over; None: no upper bound.

    Returns:
        ``(lower, upper)``, each shaped like the inputs in their float dtype promoted to at least float32 (fp32 for
        bf16 inputs); ``upper`` is None without ``vocab_size``. A token with a non-finite p or H has no meaningful
        bound (callers exclude it).

    Raises:
        ValueError: the shapes differ, or ``vocab_size`` is given and not an integer ≥ 2.

    Source: STAPO (arXiv 2602.15620) Theorem 3.1 (after Yang et al. 2025, arXiv 2505.12929, the logit-gradient
    lemma); the lower bound is Rényi-2 ≤ Shannon entropy (Σ π² ≥ e^{−H}).
    """
    shapes = {tuple(t.shape) for t in (log_prob, entropy, weight)}
    if len(shapes) != 1:
        raise ValueError(f"gradient-norm bounds need one shape for log_prob, entropy and weight, got {sorted(shapes)}")
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, entropy.dtype), torch.float32)
    p = log_prob.detach().to(dtype).exp()
    h = entropy.detach().to(dtype)
    w2 = weight.detach().to(dtype).square()
    lower = w2 * (1.0 - 2.0 * p + torch.exp(-h)).clamp_min(0.0)
    if vocab_size is None:
        return lower, None
    upper = w2 * (2.0 - 2.0 * p - logit_vocab_constant(vocab_size) * h.square()).clamp_min(0.0)
    return lower, upper


def policy_gradient_weight(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's weight in the PG term before masking, up to one constant factor of the mini-batch.

    At the old policy (ratio π_θ/π_old = 1, where neither the PPO clip nor the dual clip binds) the PG term of token
    (i, t) is w · log π_θ(y_{i,t}) to first order, w = Â_{i,t} · ρ_{i,t} · c_i: ρ the rollout-correction weight
    (``rollout_is_weights``; 1 without it) and c_i the aggregation weight of verl's ``agg_loss``, which before the
    mask is 1/N (N = Σ valid, ``token-mean``), 1 (``token-sum``), 1/B (``seq-mean-token-sum``, B = #responses),
    1/(B · scale) (``seq-mean-token-sum-norm``) — one constant over the mini-batch, returned as 1 — or
    1/(B · L_i) (``seq-mean-token-mean``, L_i = valid tokens of response i), returned as 1/L_i.

    Args:
        advantages: (bs, T) float, Â (non-finite values count as 0).
        response_mask: (bs, T) bool or int, 1 on valid response tokens (a response lies on one rank, so L_i is
            local).
        loss_agg_mode: verl's ``actor.loss_agg_mode``.
        rollout_is_weights: (bs, T) float or None (non-finite values count as 0).

    Returns:
        (bs, T) float32 (float64 for float64 advantages); 0 on padding.

    Raises:
        ValueError: the shapes differ, or ``loss_agg_mode`` is not one of verl 0.9.1's.

    Source: verl ``agg_loss`` and ``compute_policy_loss_vanilla`` (``verl.trainer.ppo.core_algos``).
    """
    tensors = (advantages, response_mask) if rollout_is_weights is None else (advantages, response_mask,
                                                                               rollout_is_weights)
    shapes = {tuple(t.shape) for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"policy_gradient_weight needs one (batch, response_len) shape, got {sorted(shapes)}")
    dtype = torch.promote_types(advantages.dtype, torch.float32)
    valid = response_mask.bool()
    w = torch.where(valid, torch.nan_to_num(advantages.detach().to(dtype), nan=0.0, posinf=0.0, neginf=0.0), 0.0)
    if rollout_is_weights is not None:
        w = w * torch.nan_to_num(rollout_is_weights.detach().to(dtype), nan=0.0, posinf=0.0, neginf=0.0)
    if loss_agg_mode == PER_RESPONSE_MEAN_AGG_MODE:
        return w / valid.sum(-1, keepdim=True).clamp_min(1).to(dtype)
    if loss_agg_mode in UNIFORM_WEIGHT_AGG_MODES:
        return w
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r}: the PG weight is known for "
                     f"{[*UNIFORM_WEIGHT_AGG_MODES, PER_RESPONSE_MEAN_AGG_MODE]}")


@dataclass(frozen=True)
class Histogram:
    """A fixed-bin histogram with exact moments: what TensorBoard's raw histogram and wandb's ``np_histogram`` take.

    Attributes:
        edges: the ``len(counts) + 1`` bin edges (ascending).
        counts: values per bin; a value below ``edges[0]`` counts in the first bin, above ``edges[-1]`` in the last.
        total, total_sq: Σ x and Σ x² of the exact values.
        low, high: the exact minimum and maximum (``inf`` / ``-inf`` when empty).
    """

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    total: float = 0.0
    total_sq: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    @property
    def num(self) -> int:
        """Number of values."""
        return int(sum(self.counts))

    @classmethod
    def of(cls, values: torch.Tensor, edges: tuple[float, ...]) -> Histogram:
        """Histogram of ``values`` ((n,) float, any device; finite) over ``edges``, out-of-range values clamped."""
        v = values.detach().double().reshape(-1)
        if v.numel() == 0:
            return cls(edges=edges, counts=(0,) * (len(edges) - 1))
        counts = torch.histc(v.clamp(edges[0], edges[-1]), bins=len(edges) - 1, min=edges[0], max=edges[-1])
        summary = torch.stack([v.sum(), (v * v).sum(), v.min(), v.max()]).cpu().tolist()
        return cls(edges=edges, counts=tuple(int(c) for c in counts.round().long().cpu().tolist()),
                   total=summary[0], total_sq=summary[1], low=summary[2], high=summary[3])

    def merge(self, other: Histogram) -> Histogram:
        """The histogram of both value sets.

        Raises:
            ValueError: the edges differ.
        """
        if tuple(other.edges) != tuple(self.edges):
            raise ValueError("cannot merge histograms with different bin edges")
        return Histogram(edges=self.edges, counts=tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
                         total=self.total + other.total, total_sq=self.total_sq + other.total_sq,
                         low=min(self.low, other.low), high=max(self.high, other.high))


@dataclass(frozen=True)
class MaskStatistics:
    """The statistics of one optimizer mini-batch (global over the DP group), see the module docstring.

    Attributes:
        n_positive: valid tokens with Â > 0.
        n_candidates: |P|.
        entropy_quantiles: H quantiles of P at :data:`QUANTILES`; None when P is empty.
        silenced_by_position: silenced tokens per third of the response (:data:`POSITION_BUCKETS`).
        histograms: :data:`HISTOGRAMS` name → :class:`Histogram`.
        grad_norm_sq_sums: Theorem 3.1's bounds on the PG logit-norm² (:func:`logit_grad_norm_sq_bounds`, weights
            :func:`policy_gradient_weight`) summed as (silenced lower, all lower, silenced upper, all upper) over
            the valid tokens with finite p and H; the upper sums are NaN when |V| was not given. None: not computed.
    """

    n_positive: int = 0
    n_candidates: int = 0
    entropy_quantiles: tuple[float, ...] | None = None
    silenced_by_position: tuple[int, int, int] = (0, 0, 0)
    histograms: dict = field(default_factory=dict)
    grad_norm_sq_sums: tuple[float, float, float, float] | None = None

    def to_metrics(self, prefix: str = "actor/stapo/") -> dict[str, float]:
        """Scalar metrics (floats), each only when defined (no candidates: no quantiles; nothing silenced: no thirds).

        Keys (after ``prefix``): ``candidate_entropy_p50``, ``_p75``, ``_p95``, ``pos_adv_below_tau_p_frac``,
        ``silenced_share_begin``, ``_middle``, ``_end``, ``silenced_grad_share`` and ``silenced_grad_share_upper``
        (in [0, 1]; 0 when no valid token carries a PG gradient; the upper one only when |V| was given). None
        contains "min" or "max" (verl's ``reduce_metrics`` takes the min / max of such keys instead of the mean).
        """
        metrics = {}
        if self.entropy_quantiles is not None:
            for q, v in zip(QUANTILES, self.entropy_quantiles, strict=True):
                metrics[f"{prefix}candidate_entropy_p{round(q * 100)}"] = float(v)
        if self.n_positive > 0:
            metrics[prefix + "pos_adv_below_tau_p_frac"] = self.n_candidates / self.n_positive
        silenced = sum(self.silenced_by_position)
        if silenced > 0:
            for name, n in zip(POSITION_BUCKETS, self.silenced_by_position, strict=True):
                metrics[f"{prefix}silenced_share_{name}"] = n / silenced
        if self.grad_norm_sq_sums is not None:
            sil_lo, all_lo, sil_up, all_up = self.grad_norm_sq_sums
            metrics[prefix + "silenced_grad_share"] = _share(sil_lo, all_lo)
            if math.isfinite(all_up):
                metrics[prefix + "silenced_grad_share_upper"] = _share(sil_up, all_up)
        return metrics


def _share(part: float, whole: float) -> float:
    """part / whole clamped to [0, 1] (part ⊂ whole, both sums of terms ≥ 0: the clamp only absorbs rounding);
    0 when whole is 0."""
    return min(max(part / whole, 0.0), 1.0) if whole > 0 else 0.0


def _low_probability(log_prob, entropy, advantages, response_mask, tau_p: float) -> dict:
    """What does not depend on the keep mask, for :func:`local_partials`:
    the valid tokens with p < τ_p (``low``: their indices; ``lp``/``ent``: their log p and H in fp32; ``pos``/``neg``:
    finite with Â > 0 / Â < 0), the (1,) count of valid tokens with Â > 0, and the log10 p bin edges."""
    p_edges = log10_p_edges(tau_p)
    lp = log_prob.detach()
    valid = response_mask.bool()
    # O(tokens): one pass for the low-probability tokens (NaN compares false), one for the positive-advantage count
    low = (valid & below_tau_p(lp, tau_p)).nonzero(as_tuple=True)
    adv_all = advantages.detach()
    n_positive = (valid & (adv_all > 0)).sum().reshape(1)
    # O(low-probability tokens) from here on
    lp_low = lp[low].float()
    ent_low = entropy.detach()[low].float()
    adv_low = torch.nan_to_num(adv_all[low].float(), nan=0.0)
    finite = torch.isfinite(lp_low) & torch.isfinite(ent_low)
    return {"low": low, "lp": lp_low, "ent": ent_low, "pos": finite & (adv_low > 0), "neg": finite & (adv_low < 0),
            "n_positive": n_positive, "p_edges": p_edges}


def _histograms(ent_pos, lp_pos, ent_neg, lp_neg, p_edges) -> dict:
    """The :data:`HISTOGRAMS` of one rank from the fp32 H and log p of its candidates (``pos``) and of its
    low-probability tokens with Â < 0 (``neg``)."""
    inv_ln10 = 1.0 / math.log(10.0)
    return {
        "entropy_adv_pos": Histogram.of(ent_pos, entropy_edges()),
        "entropy_adv_neg": Histogram.of(ent_neg, entropy_edges()),
        "log10_p_adv_pos": Histogram.of(lp_pos * inv_ln10, p_edges),
        "log10_p_adv_neg": Histogram.of(lp_neg * inv_ln10, p_edges),
    }


def _thirds(rows: torch.Tensor, cols: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The third (0, 1, 2) of the response each token (``rows``, ``cols``) lies in: ⌊3t/L⌋, L = its valid tokens."""
    return (3 * cols // valid.sum(-1)[rows].clamp_min(1)).clamp_max(2)


def local_partials(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    tau_p: float,
    *,
    vocab_size: int | None = None,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
) -> dict:
    """This rank's share of the statistics, on the CPU, ready to be exchanged over the DP group.

    Args:
        log_prob, entropy, advantages: (bs, T) float, the statistics the mask read (response layout, padded;
            responses start at position 0, as in verl's response layout).
        response_mask: (bs, T) bool or int. keep: (bs, T) bool, the mask's keep decision.
        tau_p: τ_p, ``policy_loss.s2t_tau_p``.
        vocab_size: |V| of the model's logits, for the upper gradient-norm bound; None: lower bound only.
        loss_agg_mode, rollout_is_weights: the PG weights (:func:`policy_gradient_weight`).

    Returns:
        ``{"candidate_entropy": (n,) float32, "counts": (4,) int64 [n_positive, silenced per third ×3],
        "grad_norm_sq_sums": (4,) float64 [silenced lower, all lower, silenced upper, all upper] (upper NaN
        without ``vocab_size``), "histograms": {name: Histogram}}``. "All" is every valid token with finite p and
        H; "silenced" those of them outside ``keep``.

    Raises:
        ValueError: the tensors do not share one shape, ``vocab_size`` < 2 or an unknown ``loss_agg_mode``.
        stapo_verl.algo.config_ranges.StapoConfigError (a ValueError): τ_p is outside the config's range.
    """
    shapes = {tuple(t.shape) for t in (log_prob, entropy, advantages, response_mask, keep)}
    if len(shapes) != 1:
        raise ValueError(f"mask statistics need one (batch, response_len) shape, got {sorted(shapes)}")
    lo = _low_probability(log_prob, entropy, advantages, response_mask, tau_p)
    low, pos, neg = lo["low"], lo["pos"], lo["neg"]
    valid = response_mask.bool()
    silenced = pos & ~keep.bool()[low].to(pos.device)
    by_third = torch.bincount(_thirds(low[0][silenced], low[1][silenced], valid), minlength=3)
    counts = torch.cat([lo["n_positive"], by_third]).to(torch.int64).cpu()
    return {
        "candidate_entropy": lo["ent"][pos].cpu(),
        "counts": counts,
        "grad_norm_sq_sums": _grad_norm_sq_sums(log_prob.detach(), entropy.detach(), advantages, valid, keep,
                                                vocab_size, loss_agg_mode, rollout_is_weights),
        "histograms": _histograms(lo["ent"][pos], lo["lp"][pos], lo["ent"][neg], lo["lp"][neg], lo["p_edges"]),
    }


def _bounds(log_prob, entropy, advantages, valid, vocab_size, loss_agg_mode, rollout_is_weights):
    """Theorem 3.1's (lower, upper or None) bound of every token, 0 outside the valid tokens with finite p and H
    (``counted``, as the mask's finite tokens), and ``counted``. One O(tokens) pass."""
    weight = policy_gradient_weight(advantages, valid, loss_agg_mode, rollout_is_weights)
    lower, upper = logit_grad_norm_sq_bounds(log_prob, entropy, weight, vocab_size)
    counted = valid & torch.isfinite(log_prob) & torch.isfinite(entropy)
    return [None if b is None else torch.where(counted, b, 0.0) for b in (lower, upper)], counted


def _grad_norm_sq_sums(log_prob, entropy, advantages, valid, keep, vocab_size, loss_agg_mode,
                       rollout_is_weights) -> torch.Tensor:
    """(4,) float64 on the CPU: Σ lower bound over the silenced / all valid finite tokens, then the same for the upper
    bound (NaN without ``vocab_size``); the sums accumulate in float64."""
    bounds, counted = _bounds(log_prob, entropy, advantages, valid, vocab_size, loss_agg_mode, rollout_is_weights)
    silenced = (counted & ~keep.bool().to(counted.device)).nonzero(as_tuple=True)  # few: index, don't mask
    sums = []
    for bound in bounds:
        if bound is None:
            sums += [torch.full((), math.nan, dtype=torch.float64, device=counted.device)] * 2
            continue
        sums += [bound[silenced].sum(dtype=torch.float64), bound.sum(dtype=torch.float64)]
    return torch.stack(sums).cpu()


def _statistics(entropies, counts, grad_sums, histograms) -> MaskStatistics:
    """:class:`MaskStatistics` from the group's candidate entropies ((|P|,) float32, rank order) and every rank's
    counts ((4,) int64), bound sums ((4,) float64) and histograms, each a list in rank order."""
    counts = torch.stack(counts).sum(0).tolist()
    grad_sums = tuple(torch.stack(grad_sums).sum(0).tolist())  # global sums
    hists = {}
    for name in HISTOGRAMS:
        merged = histograms[0][name]
        for h in histograms[1:]:
            merged = merged.merge(h[name])
        hists[name] = merged
    quantiles = None
    if entropies.numel() > 0:
        quantiles = tuple(quantile_linear(entropies, QUANTILES).tolist())
    return MaskStatistics(n_positive=int(counts[0]), n_candidates=int(entropies.numel()),
                          entropy_quantiles=quantiles, silenced_by_position=tuple(int(c) for c in counts[1:4]),
                          histograms=hists, grad_norm_sq_sums=grad_sums)


def combine(parts: list[dict]) -> MaskStatistics:
    """The global statistics from every rank's :func:`local_partials` (in rank order).

    Raises:
        ValueError: ``parts`` is empty.
    """
    if not parts:
        raise ValueError("combine needs the partials of at least one rank")
    return _statistics(torch.cat([p["candidate_entropy"].float() for p in parts]), [p["counts"] for p in parts],
                       [p["grad_norm_sq_sums"] for p in parts], [p["histograms"] for p in parts])


def mask_statistics(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    *,
    tau_p: float,
    group=None,
    vocab_size: int | None = None,
    loss_agg_mode: str = "token-mean",
    rollout_is_weights: torch.Tensor | None = None,
    device=None,
) -> MaskStatistics:
    """The statistics of one optimizer mini-batch for any keep mask, global over ``group``, identical on every rank.

    With its own exchange, two tensor ``all_gather`` calls on ``device`` (:func:`exchange_partials`; the plugin's
    worker wrapper calls it after the mask, with the mask's keep).

    Args:
        log_prob, entropy, advantages, response_mask, keep, tau_p, vocab_size, loss_agg_mode, rollout_is_weights:
            this rank's share, as in :func:`local_partials`.
        group: the data-parallel group whose ranks together hold the mini-batch (each token on exactly one rank);
            every rank of it must call this function. None (or no initialised process group) means this process
            holds the whole mini-batch.
        device: the device of ``group``'s collectives (None: the inputs' device).

    Returns:
        :class:`MaskStatistics`; the candidates' entropies are concatenated in rank order, as for τ_h, so the
        quantiles equal ``torch.quantile`` over the whole mini-batch; the gradient-norm shares are ratios of sums
        over the whole mini-batch (each rank's four sums travel in the same exchange, no collective of their own).

    Raises:
        ValueError: see :func:`local_partials`.
    """
    mine = local_partials(log_prob, entropy, advantages, response_mask, keep, tau_p, vocab_size=vocab_size,
                          loss_agg_mode=loss_agg_mode, rollout_is_weights=rollout_is_weights)
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return combine([mine])
    return combine(exchange_partials(mine, group, device=log_prob.device if device is None else device))


def _pack(part: dict) -> torch.Tensor:
    """A rank's :func:`local_partials` but its candidates' entropies, as one (L,) float64 tensor (L the same on every
    rank: the histograms' edges are): |P_rank|, the counts, the bound sums, then per histogram its bin counts, Σ x,
    Σ x², min, max. Counts stay exact (below 2^53)."""
    pieces = [torch.tensor([float(part["candidate_entropy"].numel())], dtype=torch.float64),
              part["counts"].double(), part["grad_norm_sq_sums"].double()]
    for name in HISTOGRAMS:
        h = part["histograms"][name]
        pieces.append(torch.tensor([*h.counts, h.total, h.total_sq, h.low, h.high], dtype=torch.float64))
    return torch.cat(pieces)


def _unpack(vector: list[float], entropies: torch.Tensor, like: dict) -> dict:
    """The inverse of :func:`_pack` (``vector`` as a list), with that rank's candidate entropies; ``like``: this
    rank's part (the histograms' edges)."""
    at = 9
    histograms = {}
    for name in HISTOGRAMS:
        edges = like["histograms"][name].edges
        bins = len(edges) - 1
        values = vector[at : at + bins + 4]
        histograms[name] = Histogram(edges=edges, counts=tuple(int(c) for c in values[:bins]), total=values[bins],
                                     total_sq=values[bins + 1], low=values[bins + 2], high=values[bins + 3])
        at += bins + 4
    return {"candidate_entropy": entropies, "counts": torch.tensor(vector[1:5], dtype=torch.int64),
            "grad_norm_sq_sums": torch.tensor(vector[5:9], dtype=torch.float64), "histograms": histograms}


def exchange_partials(mine: dict, group, *, device) -> list[dict]:
    """Every rank's :func:`local_partials` over ``group``, in rank order, in two tensor ``all_gather`` calls on
    ``device`` (the group's collectives' device): the fixed-size summaries (:func:`_pack`), then the candidates'
    entropies padded to the largest count. Every rank of ``group`` must call it."""
    world = dist.get_world_size(group)
    packed = _pack(mine).to(device)
    summaries = [torch.empty_like(packed) for _ in range(world)]
    dist.all_gather(summaries, packed, group=group)
    table = torch.stack(summaries).tolist()
    sizes = [int(row[0]) for row in table]
    ent = mine["candidate_entropy"].float().to(device)
    padded = ent.new_zeros(max(max(sizes), 1))
    padded[: ent.numel()] = ent
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    entropies = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)]).cpu()
    starts = [sum(sizes[:r]) for r in range(world)]
    return [_unpack(row, entropies[start : start + size], mine)
            for row, start, size in zip(table, starts, sizes, strict=True)]
