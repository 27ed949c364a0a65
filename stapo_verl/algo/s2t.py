"""S2T (Silencing Spurious Tokens) mask of STAPO: candidates, the entropy threshold τ_h, the keep mask.

STAPO: "Spurious-Token-Aware Policy Optimization" (https://arxiv.org/abs/2602.15620), §3 and Algorithm 1.
A response token (i, t) is *spurious* iff  Â_i > 0  and  p_{i,t} < τ_p  and  H_{i,t} < τ_h  (all strict), where
τ_h = Quantile_q(P) with linear interpolation over the candidate population
P = {H_{i,t} : valid, Â_i > 0, p_{i,t} < τ_p}, gathered over the data-parallel group. Spurious tokens are removed
from the policy-gradient term and from its token-mean denominator.

Pure tensor code (torch only). The only side effects are two collectives of ``torch.distributed`` over the group
the caller passes: ``all_gather_object`` of the candidate population (a few rows per response) and an
``all_reduce`` of the token counts. ``group=None`` (or an uninitialised process group) means this process holds the
whole population.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

#: torch.quantile refuses inputs above 2**24 elements ("quantile() input tensor is too large").
TORCH_QUANTILE_MAX_NUMEL = 2**24

#: ``(candidate entropies (n,) float32) -> (silenced (n,) bool, τ_h or None)``: which candidates a mask silences.
CandidateSelection = Callable[[torch.Tensor], "tuple[torch.Tensor, float | None]"]


def linear_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """q-quantile with linear interpolation, identical to ``torch.quantile(values, q)``, for any size.

    Args:
        values: 1-D finite float tensor, at least one element.
        q: quantile in [0, 1].

    Returns:
        0-dim tensor in ``values.dtype``.

    Raises:
        ValueError: ``values`` is empty or not 1-D, or q outside [0, 1].

    Source: ``torch.quantile`` (``interpolation='linear'``); ``torch.kthvalue`` above torch's size limit.
    """
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"linear_quantile needs a non-empty 1-D tensor, got shape {tuple(values.shape)}")
    if not (0.0 <= q <= 1.0):
        raise ValueError(f"quantile q={q!r} must lie in [0, 1]")
    n = values.numel()
    if n <= TORCH_QUANTILE_MAX_NUMEL:
        return torch.quantile(values, q, interpolation="linear")
    # Same arithmetic as torch.quantile (rank computed in the input dtype), via two order statistics.
    rank = torch.tensor(q, dtype=values.dtype) * (n - 1)
    lo = int(torch.floor(rank).item())
    hi = min(lo + 1, n - 1)
    v_lo = torch.kthvalue(values, lo + 1).values
    v_hi = torch.kthvalue(values, hi + 1).values if hi != lo else v_lo
    return torch.lerp(v_lo, v_hi, rank - lo)


@dataclass(frozen=True)
class S2TStats:
    """Population statistics of one mask computation, global over the data-parallel group.

    Attributes:
        n_valid: valid response tokens (``response_mask`` = 1), non-finite ones included.
        n_candidates: |P|, valid finite tokens with Â > 0 and p < τ_p.
        n_masked: silenced tokens.
        n_nonfinite: valid tokens with a non-finite log-prob or entropy (outside the keep mask).
        tau_h: τ_h in nats; None when P is empty or the selection uses no threshold.
        masked_p_sum: Σ p over the silenced tokens.
        masked_h_sum: Σ H (nats) over the silenced tokens.
    """

    n_valid: int = 0
    n_candidates: int = 0
    n_masked: int = 0
    n_nonfinite: int = 0
    tau_h: float | None = None
    masked_p_sum: float = 0.0
    masked_h_sum: float = 0.0

    @property
    def n_keep(self) -> int:
        """Tokens left in the policy-gradient term: valid − silenced − non-finite."""
        return self.n_valid - self.n_masked - self.n_nonfinite

    def to_metrics(self, prefix: str = "actor/stapo/") -> dict[str, float]:
        """Metrics as verl logs them (floats). ``tau_h`` and the means over silenced tokens only when defined.

        Keys (after ``prefix``): masked_frac, candidate_frac, num_masked, num_candidates, nonfinite_tokens,
        renorm_factor (n_valid / n_keep), tau_h, masked_p_mean, masked_entropy_mean.
        """
        denom = max(self.n_valid, 1)
        metrics = {
            prefix + "masked_frac": self.n_masked / denom,
            prefix + "candidate_frac": self.n_candidates / denom,
            prefix + "num_masked": float(self.n_masked),
            prefix + "num_candidates": float(self.n_candidates),
            prefix + "nonfinite_tokens": float(self.n_nonfinite),
            prefix + "renorm_factor": self.n_valid / max(self.n_keep, 1),
        }
        if self.tau_h is not None:
            metrics[prefix + "tau_h"] = float(self.tau_h)
        if self.n_masked > 0:
            metrics[prefix + "masked_p_mean"] = self.masked_p_sum / self.n_masked
            metrics[prefix + "masked_entropy_mean"] = self.masked_h_sum / self.n_masked
        return metrics


def candidate_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate set P (Â > 0 and p < τ_p on valid finite tokens) and the non-finite valid tokens.

    Args:
        log_prob: (bs, T) float, log p of the sampled token (any float dtype; read detached, in fp32).
        entropy: (bs, T) float, entropy in nats of the same distribution.
        advantages: (bs, T) float, Â broadcast over the response.
        response_mask: (bs, T) bool or int, 1 on real response tokens (padding is never a candidate).
        tau_p: τ_p in (0, 1); p < τ_p is evaluated as log p < ln τ_p.

    Returns:
        ``(candidates, nonfinite)``, both (bs, T) bool.

    Raises:
        ValueError: the four tensors do not share one shape.

    Source: STAPO paper §3 (conditions Â > 0 and p < τ_p); non-finite values are excluded and dropped.
    """
    shapes = {tuple(t.shape) for t in (log_prob, entropy, advantages, response_mask)}
    if len(shapes) != 1:
        raise ValueError(f"S2T inputs must share one (batch, response_len) shape, got {sorted(shapes)}")
    lp = log_prob.detach().float()
    ent = entropy.detach().float()
    valid = response_mask.bool()
    finite = torch.isfinite(lp) & torch.isfinite(ent)
    nonfinite = valid & ~finite
    adv = torch.nan_to_num(advantages.detach().float(), nan=0.0)
    below_tau_p = torch.where(finite, lp, torch.zeros_like(lp)) < math.log(tau_p)
    return valid & finite & (adv > 0) & below_tau_p, nonfinite


def low_entropy_selection(q: float) -> CandidateSelection:
    """The S2T rule: silence candidates with H < τ_h = Quantile_q(P) (linear interpolation, strict, ties kept).

    Args:
        q: entropy quantile in [0, 1] (paper: 0.75).

    Returns:
        A :data:`CandidateSelection`.

    Source: STAPO paper §3 (C3) and Algorithm 1.
    """

    def select(entropy: torch.Tensor) -> tuple[torch.Tensor, float | None]:
        if entropy.numel() == 0:
            return torch.zeros(0, dtype=torch.bool), None
        tau_h = linear_quantile(entropy, q)
        return entropy < tau_h, float(tau_h)

    return select


def _gather_population(rows: torch.Tensor, group) -> tuple[torch.Tensor, int]:
    """All candidate rows of the group in rank order (on the CPU), and the offset of this rank's rows in it."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return rows.cpu(), 0
    parts = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, rows.cpu(), group=group)
    offset = sum(p.shape[0] for p in parts[: dist.get_rank(group)])
    return torch.cat(parts, dim=0), offset


def _sum_over_group(values: torch.Tensor, group) -> torch.Tensor:
    """``values`` summed over the group (a new tensor; identity without a distributed group)."""
    out = values.detach().clone()
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def s2t_keep_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_p: float = 0.002,
    q: float = 0.75,
    group=None,
    select: CandidateSelection | None = None,
) -> tuple[torch.Tensor, S2TStats]:
    """Keep mask K = valid ∧ finite ∧ ¬spurious for this rank's share of one optimizer mini-batch.

    The candidate population is gathered over ``group`` before the threshold is taken, so every rank applies the
    same τ_h and the mask does not depend on how the mini-batch is split over ranks or micro-batches.

    Args:
        log_prob, entropy, advantages, response_mask: (bs, T), as in :func:`candidate_mask`.
        tau_p: τ_p (paper: 0.002).
        q: entropy quantile (paper: 0.75).
        group: the data-parallel process group whose ranks together hold the mini-batch (each token on exactly
            one rank); None when this process holds all of it.
        select: which candidates to silence, given the gathered candidate entropies (n,) in rank order; must be
            deterministic so that every rank agrees. Default: :func:`low_entropy_selection` with ``q`` (S2T).

    Returns:
        ``(keep, stats)``: keep is (bs, T) bool on the device of ``log_prob``; stats are global over ``group``.

    Raises:
        ValueError: the inputs do not share one shape.

    Source: STAPO paper §3 and Algorithm 1, generalised to data parallelism.
    """
    cand, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    select = low_entropy_selection(q) if select is None else select
    lp = log_prob.detach().float()
    ent = entropy.detach().float()
    rows, offset = _gather_population(torch.stack([ent[cand], lp[cand]], dim=1).double(), group)
    silenced, tau_h = select(rows[:, 0].float())
    n_local = int(cand.sum())
    spurious = torch.zeros_like(cand)
    spurious[cand] = silenced[offset : offset + n_local].to(cand.device)
    keep = response_mask.bool() & ~nonfinite & ~spurious
    counts = _sum_over_group(torch.stack([response_mask.bool().sum(), nonfinite.sum()]).double(), group).cpu()
    stats = S2TStats(
        n_valid=int(counts[0]),
        n_candidates=int(rows.shape[0]),
        n_masked=int(silenced.sum()),
        n_nonfinite=int(counts[1]),
        tau_h=tau_h,
        masked_p_sum=float(rows[silenced, 1].exp().sum()),
        masked_h_sum=float(rows[silenced, 0].sum()),
    )
    return keep, stats
