"""Mask statistics of one optimizer mini-batch, global over the data-parallel group (torch only).

What a user reads in the trackers under ``actor/stapo/`` besides the mask's own counts (``S2TStats``):

=====================================  ==========================================================================
``candidate_entropy_p50/p75/p95``      quantiles (linear interpolation, as τ_h) of H over the candidates P
                                       (valid, finite, Â > 0, p < τ_p); with ``entropy_quantile=0.75`` the p75
                                       *is* τ_h
``pos_adv_below_tau_p_frac``           |P| / #(valid tokens with Â > 0): how much of the positive-advantage
                                       signal sits below τ_p
``silenced_share_begin/middle/end``    share of the silenced tokens in the first, middle and last third of their
                                       response (position t of a response of length L is in third ⌊3t/L⌋)
histograms (not scalars)               H and log10 p of the low-probability tokens (valid, finite, p < τ_p),
                                       split by the sign of Â: ``entropy_adv_pos`` / ``entropy_adv_neg`` /
                                       ``log10_p_adv_pos`` / ``log10_p_adv_neg`` (Â > 0 is P itself)
=====================================  ==========================================================================

Cost: two O(tokens) passes (the indices of the valid tokens with p < τ_p, the count of positive-advantage tokens);
everything else is O(low-probability tokens): the finiteness and sign tests, the silenced tokens' thirds, two
fixed-bin ``histc`` per sign, the candidate entropies' quantiles. The DP group exchanges one small
object per rank (the candidates' entropies, a few hundred floats at the paper's candidate rate, and the histogram
counts). ``benchmarks/bench_diagnostics.py`` measures it at the production shape.

Source: STAPO (arXiv 2602.15620) §3 for P, τ_p and τ_h; the quantile is :func:`stapo_verl.algo.s2t.linear_quantile`,
the function τ_h is computed with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from stapo_verl.algo.s2t import linear_quantile

#: quantiles of the candidates' entropy logged as ``candidate_entropy_p<100·q>``
QUANTILES = (0.5, 0.75, 0.95)
#: thirds of a response, in order
POSITION_BUCKETS = ("begin", "middle", "end")
#: entropy histogram range in nats and bin count (0.25-nat bins; ln 151,936 = 11.93 for Qwen3's vocabulary; values
#: above the range are counted in the last bin, the exact maximum is kept)
ENTROPY_RANGE = (0.0, 12.0)
ENTROPY_BINS = 48
#: lower end of the log10 p histogram (the upper end is log10 τ_p); lower values are counted in the first bin
LOG10_P_LOW = -12.0
LOG10_P_BINS = 40
#: histogram names, in the order they are logged
HISTOGRAMS = ("entropy_adv_pos", "entropy_adv_neg", "log10_p_adv_pos", "log10_p_adv_neg")


def entropy_edges() -> tuple[float, ...]:
    """The ``ENTROPY_BINS + 1`` entropy bin edges over :data:`ENTROPY_RANGE` (nats)."""
    lo, hi = ENTROPY_RANGE
    return tuple(lo + (hi - lo) * i / ENTROPY_BINS for i in range(ENTROPY_BINS + 1))


def log10_p_edges(tau_p: float) -> tuple[float, ...]:
    """The ``LOG10_P_BINS + 1`` log10 p bin edges from :data:`LOG10_P_LOW` to log10 τ_p.

    Raises:
        ValueError: τ_p is not in (10**LOG10_P_LOW, 1).
    """
    hi = math.log10(tau_p) if 0.0 < tau_p < 1.0 else float("nan")
    if not (LOG10_P_LOW < hi < 0.0):
        raise ValueError(f"tau_p={tau_p!r}: the log10 p histogram needs 1e{LOG10_P_LOW:g} < tau_p < 1")
    return tuple(LOG10_P_LOW + (hi - LOG10_P_LOW) * i / LOG10_P_BINS for i in range(LOG10_P_BINS + 1))


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
    """

    n_positive: int = 0
    n_candidates: int = 0
    entropy_quantiles: tuple[float, ...] | None = None
    silenced_by_position: tuple[int, int, int] = (0, 0, 0)
    histograms: dict = field(default_factory=dict)

    def to_metrics(self, prefix: str = "actor/stapo/") -> dict[str, float]:
        """Scalar metrics (floats), each only when defined (no candidates: no quantiles; nothing silenced: no shares).

        Keys (after ``prefix``): ``candidate_entropy_p50``, ``_p75``, ``_p95``, ``pos_adv_below_tau_p_frac``,
        ``silenced_share_begin``, ``_middle``, ``_end``. None contains "min" or "max" (verl's ``reduce_metrics``
        takes the min / max of such keys instead of the mean).
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
        return metrics


def local_partials(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    tau_p: float,
) -> dict:
    """This rank's share of the statistics, on the CPU, ready to be exchanged over the DP group.

    Args:
        log_prob, entropy, advantages: (bs, T) float, the statistics the mask read (response layout, padded;
            responses start at position 0, as in verl's response layout).
        response_mask: (bs, T) bool or int. keep: (bs, T) bool, the mask's keep decision.
        tau_p: τ_p in (0, 1).

    Returns:
        ``{"candidate_entropy": (n,) float32, "counts": (4,) int64 [n_positive, silenced per third ×3],
        "histograms": {name: Histogram}}``.

    Raises:
        ValueError: the tensors do not share one shape, or τ_p is out of range.
    """
    shapes = {tuple(t.shape) for t in (log_prob, entropy, advantages, response_mask, keep)}
    if len(shapes) != 1:
        raise ValueError(f"mask statistics need one (batch, response_len) shape, got {sorted(shapes)}")
    p_edges = log10_p_edges(tau_p)
    lp = log_prob.detach()
    valid = response_mask.bool()
    # O(tokens): one pass for the low-probability tokens (NaN compares false), one for the positive-advantage count
    low = (valid & (lp < math.log(tau_p))).nonzero(as_tuple=True)
    adv_all = advantages.detach()
    n_positive = (valid & (adv_all > 0)).sum()
    # O(low-probability tokens) from here on
    lp_low = lp[low].float()
    ent_low = entropy.detach()[low].float()
    adv_low = torch.nan_to_num(adv_all[low].float(), nan=0.0)
    finite = torch.isfinite(lp_low) & torch.isfinite(ent_low)
    pos, neg = finite & (adv_low > 0), finite & (adv_low < 0)
    silenced = pos & ~keep.bool()[low].to(pos.device)
    rows, cols = low[0][silenced], low[1][silenced]
    third = (3 * cols // valid.sum(-1)[rows].clamp_min(1)).clamp_max(2)
    by_third = torch.bincount(third, minlength=3)
    counts = torch.cat([n_positive.reshape(1), by_third]).to(torch.int64).cpu()
    inv_ln10 = 1.0 / math.log(10.0)
    return {
        "candidate_entropy": ent_low[pos].cpu(),
        "counts": counts,
        "histograms": {
            "entropy_adv_pos": Histogram.of(ent_low[pos], entropy_edges()),
            "entropy_adv_neg": Histogram.of(ent_low[neg], entropy_edges()),
            "log10_p_adv_pos": Histogram.of(lp_low[pos] * inv_ln10, p_edges),
            "log10_p_adv_neg": Histogram.of(lp_low[neg] * inv_ln10, p_edges),
        },
    }


def combine(parts: list[dict]) -> MaskStatistics:
    """The global statistics from every rank's :func:`local_partials` (in rank order).

    Raises:
        ValueError: ``parts`` is empty.
    """
    if not parts:
        raise ValueError("combine needs the partials of at least one rank")
    entropies = torch.cat([p["candidate_entropy"].float() for p in parts])
    counts = torch.stack([p["counts"] for p in parts]).sum(0).tolist()
    hists = {}
    for name in HISTOGRAMS:
        merged = parts[0]["histograms"][name]
        for p in parts[1:]:
            merged = merged.merge(p["histograms"][name])
        hists[name] = merged
    quantiles = None
    if entropies.numel() > 0:
        quantiles = tuple(float(linear_quantile(entropies, q)) for q in QUANTILES)
    return MaskStatistics(n_positive=int(counts[0]), n_candidates=int(entropies.numel()),
                          entropy_quantiles=quantiles, silenced_by_position=tuple(int(c) for c in counts[1:4]),
                          histograms=hists)


def mask_statistics(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    keep: torch.Tensor,
    *,
    tau_p: float,
    group=None,
) -> MaskStatistics:
    """The statistics of one optimizer mini-batch, global over ``group``, identical on every rank of it.

    Args:
        log_prob, entropy, advantages, response_mask, keep, tau_p: this rank's share, as in :func:`local_partials`.
        group: the data-parallel group whose ranks together hold the mini-batch (each token on exactly one rank);
            every rank of it must call this function. None (or no initialised process group) means this process
            holds the whole mini-batch.

    Returns:
        :class:`MaskStatistics`; the candidates' entropies are concatenated in rank order, as for τ_h, so the
        quantiles equal ``linear_quantile`` over the whole mini-batch.

    Raises:
        ValueError: see :func:`local_partials`.
    """
    mine = local_partials(log_prob, entropy, advantages, response_mask, keep, tau_p)
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return combine([mine])
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, mine, group=group)
    return combine(parts)
