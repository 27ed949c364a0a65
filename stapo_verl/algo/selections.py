"""The paper's ablations of the S2T selection, and the 20-Entropy selection (pure tensor code, torch only).

Each ablation is a :data:`CandidateSelection`: given the entropies of the whole candidate population P (gathered over
the data-parallel group, in rank order), it says which candidates to silence. :func:`s2t_ablation_keep_mask` applies
one with the S2T mask's own candidates, gathering and metrics (:mod:`stapo_verl.algo.s2t`), so population, counting
and renormalisation are the S2T mask's. Source: STAPO paper (arXiv 2602.15620) §4.4 (masking-strategy ablation) and
JustRL-FullMask. These stay in the plugin; the upstream series carries the S2T mask only.

:func:`top_entropy_keep_mask` is the 20-Entropy baseline ("Beyond the 80/20 Rule", Wang et al. 2025,
arXiv 2506.01939; https://github.com/Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR): keep the ⌈ρ·N⌉ tokens of highest
entropy, here over the whole optimizer mini-batch across the data-parallel group.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from stapo_verl.algo.s2t import candidate_mask, gather_candidates, keep_from_silenced, s2t_metrics
from stapo_verl.algo.config_ranges import check_range

#: bits kept of a derived seed (``torch.Generator.manual_seed`` takes a signed 64-bit value)
_SEED_BITS = 0x7FFF_FFFF_FFFF_FFFF

#: ``(candidate entropies (n,) float32) -> (silenced (n,) bool, threshold or None)``: which candidates a mask silences
CandidateSelection = Callable[[torch.Tensor], "tuple[torch.Tensor, torch.Tensor | float | None]"]

#: the most elements ``torch.quantile`` accepts (it raises above); :func:`quantile_linear` has no such limit
TORCH_QUANTILE_MAX_NUMEL = 2**24


def quantile_linear(values: torch.Tensor, q) -> torch.Tensor:
    """``torch.quantile(values, q)`` (linear) without its 2^24-element limit, bit for bit where both run: one sort,
    rank q·(n − 1) in the values' dtype (float64 above 2^24), ``lerp`` of its neighbours. ``values``: (n,) finite,
    n ≥ 1; ``q``: a float in [0, 1] (0-d result) or a sequence of them ((len(q),)). Raises ValueError (shape)."""
    if values.ndim != 1 or values.numel() == 0:
        raise ValueError(f"quantile_linear needs a non-empty 1-d tensor, got shape {tuple(values.shape)}")
    n, qs = values.numel(), list(q) if isinstance(q, list | tuple) else [q]
    ranks = torch.tensor(qs, dtype=values.dtype if n <= TORCH_QUANTILE_MAX_NUMEL else torch.float64) * (n - 1)
    below, ordered = ranks.long().to(values.device), torch.sort(values).values
    out = torch.lerp(ordered[below], ordered[ranks.ceil().long().to(values.device)], (ranks - ranks.floor()).to(values))
    return out if isinstance(q, list | tuple) else out[0]


def s2t_ablation_keep_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_p: float,
    select: CandidateSelection,
    group=None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Keep mask of an S2T ablation: the S2T candidates (Â > 0, p < τ_p, gathered over ``group``), of which
    ``select`` silences some; valid non-finite tokens are dropped as in S2T.

    Args:
        log_prob, entropy, advantages, response_mask: (bs, T), as in :func:`stapo_verl.algo.s2t.candidate_mask`.
        tau_p: τ_p. select: a deterministic :data:`CandidateSelection` (every rank must agree).
        group: the data-parallel group holding the mini-batch, or None (the inputs on its collectives' device).

    Returns:
        ``(keep (bs, T) bool, metrics)`` with the S2T mask's metric keys (``tau_h``: the selection's threshold).

    Raises:
        ValueError: the inputs do not share one shape.
    """
    candidates, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    rows, mine, index, n_valid, n_nonfinite = gather_candidates(log_prob, entropy, response_mask, candidates,
                                                                nonfinite, group)
    silenced, tau = select(rows[:, 0])
    silenced = silenced.to(rows.device)
    keep = keep_from_silenced(candidates, nonfinite, response_mask, silenced, mine, index)
    return keep, s2t_metrics(rows, silenced, n_valid, n_nonfinite, tau)


def high_entropy_selection(q: float) -> CandidateSelection:
    """Ablation: silence the candidates above the (1 − q) quantile (H > τ, strict, ties kept).

    The mirror image of S2T: for distinct values it silences as many candidates as S2T does.
    """

    def select(entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float | None]:
        if entropy.numel() == 0:
            return torch.zeros(0, dtype=torch.bool), None
        tau = quantile_linear(entropy, 1.0 - q)
        return entropy > tau, tau

    return select


def random_selection(q: float, seed: int) -> CandidateSelection:
    """Ablation: silence as many candidates as S2T would (H < Quantile_q), drawn uniformly without replacement.

    Args:
        q: the S2T quantile that fixes the budget.
        seed: RNG seed; must be equal on every rank (see :func:`mask_seed`).
    """

    def select(entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float | None]:
        n = entropy.numel()
        if n == 0:
            return torch.zeros(0, dtype=torch.bool), None
        tau = quantile_linear(entropy, q)
        budget = int((entropy < tau).sum())
        generator = torch.Generator().manual_seed(int(seed) & _SEED_BITS)
        silenced = torch.zeros(n, dtype=torch.bool)
        silenced[torch.randperm(n, generator=generator)[:budget]] = True
        return silenced, tau

    return select


def full_selection() -> CandidateSelection:
    """Ablation (JustRL-FullMask): silence every candidate (no entropy condition)."""

    def select(entropy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float | None]:
        return torch.ones(entropy.numel(), dtype=torch.bool), None

    return select


def mask_seed(seed: int, global_step: int, mini_batch_index: int) -> int:
    """Seed of a random mask for one optimizer mini-batch, from (seed, verl global step, mini-batch index).

    A function of the position in training only (no per-process counter), so a resumed run masks exactly as an
    uninterrupted one and every DP rank draws the same permutation.

    Raises:
        ValueError: a negative step or index.
    """
    if global_step < 0 or mini_batch_index < 0:
        raise ValueError(f"global_step={global_step} and mini_batch_index={mini_batch_index} must be >= 0")
    return ((int(seed) * 1_000_003 + int(global_step)) * 1_000_003 + int(mini_batch_index)) & _SEED_BITS


def top_entropy_keep_mask(
    entropy: torch.Tensor, response_mask: torch.Tensor, ratio: float, group=None
) -> tuple[torch.Tensor, dict[str, float]]:
    """20-Entropy: keep the ⌈ρ·N⌉ valid finite tokens of highest entropy, N counted over ``group``.

    Every rank contributes its local top-k (k = ⌈ρ·N⌉ capped by its own count); the global k-th largest entropy τ
    is taken over their union and each rank keeps its tokens with H ≥ τ (ties at τ are all kept).

    Args:
        entropy: (bs, T) float, entropy in nats. response_mask: (bs, T) bool/int.
        ratio: ρ, ``policy_loss.top_entropy_ratio`` (0 < ρ <= 1).
        group: data-parallel group holding the mini-batch, or None.

    Returns:
        ``(keep (bs, T) bool, {"actor/top_entropy/kept_frac": float, "actor/top_entropy/threshold": float})``
        (the threshold only when something is kept).

    Raises:
        ValueError: shapes differ. stapo_verl.algo.config_ranges.StapoConfigError (a ValueError): ``ratio`` is
            outside the config's range of ``top_entropy_ratio``.
    """
    if tuple(entropy.shape) != tuple(response_mask.shape):
        raise ValueError(f"entropy {tuple(entropy.shape)} and response_mask {tuple(response_mask.shape)} differ")
    check_range("top_entropy_ratio", ratio)
    ent = entropy.detach().float()
    usable = response_mask.bool() & torch.isfinite(ent)
    distributed = group is not None and dist.is_initialized() and dist.get_world_size(group) > 1
    counts = torch.stack([usable.sum(), response_mask.bool().sum()]).to(torch.int64)
    if distributed:
        dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    n_usable, n_valid = counts.tolist()
    k = min(n_usable, max(1, int(n_usable * ratio + 0.9999))) if n_usable else 0
    if k == 0:
        return torch.zeros_like(usable), {"actor/top_entropy/kept_frac": 0.0}
    # each rank's top min(k, its count) entropies, -inf beyond its count: one (k,) tensor per rank, gathered
    local = torch.where(usable, ent, -math.inf).reshape(-1)
    top = torch.topk(local, min(k, local.numel())).values
    top = torch.cat([top, top.new_full((k - top.numel(),), -math.inf)])
    if distributed:
        parts = [torch.empty_like(top) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, top, group=group)
        top = torch.cat(parts)
    tau = torch.topk(top, k).values[-1]
    keep = usable & (ent >= tau)
    n_keep = keep.sum().to(torch.int64)
    if distributed:
        dist.all_reduce(n_keep, op=dist.ReduceOp.SUM, group=group)
    n_kept, threshold = torch.stack([n_keep.double(), tau.double()]).tolist()
    return keep, {"actor/top_entropy/kept_frac": n_kept / max(n_valid, 1), "actor/top_entropy/threshold": threshold}
