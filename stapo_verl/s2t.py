"""S2T (Silencing Spurious Tokens) mask maths: candidates, the entropy threshold τ_h, the ablation masks.

Pure tensor code; the only side effects are the DP collectives of :mod:`stapo_verl.dist_utils`.
Source: STAPO paper §3 (S2T definition, Algorithm 1); project spec ``stapo_spec.md`` §2.2–2.5 and §8.1.

A token (i, t) is *spurious* iff  Â_i > 0  and  p_{i,t} < τ_p  and  H_{i,t} < τ_h  (all strict), where
τ_h = Quantile_q(P) with linear interpolation and P = {H : valid, Â > 0, p < τ_p} gathered over the whole
population the caller passes (one optimizer mini-batch across DP ranks by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from stapo_verl.dist_utils import all_gather_rows, all_reduce_sum, group_rank

#: torch.quantile refuses inputs above 2**24 elements ("quantile() input tensor is too large"; torch 2.13).
TORCH_QUANTILE_MAX_NUMEL = 2**24

#: S2T variants: the paper's mask and its ablations (paper §4.4 / spec §8.1).
MASK_MODES = ("low_entropy", "high_entropy", "random", "full")

#: verl ``loss_mode`` → S2T mask mode, for the loss modes built on the S2T mask (not ``top_entropy``).
S2T_LOSS_MODES = {
    "stapo": "low_entropy",
    "stapo_high_entropy": "high_entropy",
    "stapo_random": "random",
    "stapo_full_mask": "full",
}


def linear_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """q-quantile with linear interpolation, identical to ``torch.quantile(values, q)``, for any size.

    Args:
        values: 1-D finite float tensor, at least one element.
        q: quantile in [0, 1].
    Returns:
        0-dim tensor in ``values.dtype``.
    Raises:
        ValueError: ``values`` is empty or not 1-D, or q outside [0, 1].
    Source: spec A4 (torch.quantile's linear rule; ``kthvalue`` above torch's size limit).
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


@dataclass
class MaskStats:
    """Population statistics of one mask computation (global over the DP group when one is given).

    Attributes (counts are token counts; p is a probability, H in nats):
        n_valid: valid response tokens (response_mask = 1), including non-finite ones.
        n_candidates: |P|, valid finite tokens with Â > 0 and p < τ_p.
        n_masked: silenced tokens.
        n_nonfinite: valid tokens with a non-finite log-prob or entropy (dropped from the loss).
        tau_h: the entropy threshold τ_h in nats, None when P is empty or the mode uses none.
        masked_p_sum, masked_h_sum: Σ p and Σ H over silenced tokens (for means).
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
        """Tokens left in the loss: valid − masked − non-finite."""
        return self.n_valid - self.n_masked - self.n_nonfinite

    def to_metrics(self, prefix: str = "actor/stapo/") -> dict[str, float]:
        """verl metric dict (floats). Means over masked tokens and τ_h are omitted when undefined.

        Keys: masked_frac, candidate_frac, num_masked, num_candidates (= population_size), nonfinite_tokens,
        renorm_factor (n_valid / n_keep), tau_h, masked_p_mean, masked_entropy_mean.
        """
        denom = max(self.n_valid, 1)
        m = {
            prefix + "masked_frac": self.n_masked / denom,
            prefix + "candidate_frac": self.n_candidates / denom,
            prefix + "num_masked": float(self.n_masked),
            prefix + "num_candidates": float(self.n_candidates),
            prefix + "nonfinite_tokens": float(self.n_nonfinite),
            prefix + "renorm_factor": self.n_valid / max(self.n_keep, 1),
        }
        if self.tau_h is not None:
            m[prefix + "tau_h"] = float(self.tau_h)
        if self.n_masked > 0:
            m[prefix + "masked_p_mean"] = self.masked_p_sum / self.n_masked
            m[prefix + "masked_entropy_mean"] = self.masked_h_sum / self.n_masked
        return m


def _check_shapes(**tensors: torch.Tensor) -> None:
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"S2T inputs must share one (batch, response_len) shape, got {shapes}")


def candidate_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_p: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate set P (conditions C1, C2) and the non-finite valid tokens.

    Args:
        log_prob: (bs, T) float, log p of the sampled token (any dtype; detached here).
        entropy: (bs, T) float, entropy in nats of the same distribution.
        advantages: (bs, T) float, Â broadcast over the response.
        response_mask: (bs, T) bool/int, 1 for real response tokens (padding is 0 and never selected).
        tau_p: τ_p in (0, 1); p < τ_p is evaluated as log p < ln τ_p.
    Returns:
        (candidates bool (bs, T), nonfinite bool (bs, T)).
    Raises:
        ValueError: shapes differ.
    Source: spec §2.2 (C1, C2), §2.4 (non-finite values are excluded and dropped).
    """
    _check_shapes(log_prob=log_prob, entropy=entropy, advantages=advantages, response_mask=response_mask)
    lp = log_prob.detach().float()
    ent = entropy.detach().float()
    valid = response_mask.bool()
    finite = torch.isfinite(lp) & torch.isfinite(ent)
    nonfinite = valid & ~finite
    # torch.where keeps NaN out of the comparisons' consumers.
    adv = torch.nan_to_num(advantages.detach().float(), nan=0.0)
    cand = valid & finite & (adv > 0) & (torch.where(finite, lp, torch.zeros_like(lp)) < math.log(tau_p))
    return cand, nonfinite


def _select_global(pop_h: torch.Tensor, q: float, mode: str, seed: int | None) -> tuple[torch.Tensor, float | None]:
    """Which members of the global population are silenced. Returns (bool (n,), τ_h or None)."""
    n = pop_h.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.bool), None
    if mode == "full":
        return torch.ones(n, dtype=torch.bool), None
    if mode == "high_entropy":
        # Mirror image of STAPO: silence the top q share (strict >, ties kept).
        tau = linear_quantile(pop_h, 1.0 - q)
        return pop_h > tau, float(tau)
    tau = linear_quantile(pop_h, q)
    low = pop_h < tau
    if mode == "low_entropy":
        return low, float(tau)
    if mode == "random":
        # Same budget as STAPO, members drawn uniformly; every rank draws the same permutation.
        g = torch.Generator().manual_seed(int(seed or 0) & 0x7FFF_FFFF_FFFF_FFFF)
        chosen = torch.randperm(n, generator=g)[: int(low.sum())]
        sel = torch.zeros(n, dtype=torch.bool)
        sel[chosen] = True
        return sel, float(tau)
    raise ValueError(f"mask mode {mode!r}: allowed {list(MASK_MODES)}")


def s2t_keep_mask(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_p: float = 0.002,
    q: float = 0.75,
    mode: str = "low_entropy",
    group=None,
    seed: int | None = None,
) -> tuple[torch.Tensor, MaskStats]:
    """Keep mask K = valid ∧ finite ∧ ¬spurious, with τ_h taken over the population of the whole DP group.

    Args:
        log_prob, entropy, advantages, response_mask: (bs, T) as in :func:`candidate_mask`.
        tau_p: τ_p (default 0.002). q: entropy quantile (default 0.75).
        mode: ``low_entropy`` (STAPO), ``high_entropy``, ``random`` (same count as STAPO, uniform),
            ``full`` (all candidates).
        group: DP process group whose ranks together hold one optimizer mini-batch (or micro-batch);
            None = this process holds the whole population.
        seed: RNG seed for ``mode='random'``; must be equal on all ranks.
    Returns:
        (keep bool (bs, T), :class:`MaskStats` with global counts).
    Raises:
        ValueError: shapes differ or ``mode`` unknown.
    Source: spec §2.5 reference implementation, generalised to DP; paper Algorithm 1.
    """
    if mode not in MASK_MODES:
        raise ValueError(f"mask mode {mode!r}: allowed {list(MASK_MODES)}")
    cand, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    valid = response_mask.bool()
    lp = log_prob.detach().float()
    ent = entropy.detach().float()
    # gathered on the device (NCCL needs it), then one small copy of the population to the host for the quantile
    rows, sizes = all_gather_rows(torch.stack([ent[cand], lp[cand]], dim=1).double(), group)
    rows = rows.cpu()
    sel, tau_h = _select_global(rows[:, 0].float(), q, mode, seed)
    offset = sum(sizes[: group_rank(group)])
    local_sel = sel[offset : offset + sizes[group_rank(group)]].to(cand.device)
    spurious = torch.zeros_like(cand)
    spurious[cand] = local_sel
    keep = valid & ~nonfinite & ~spurious
    counts = all_reduce_sum(torch.stack([valid.sum(), nonfinite.sum()]).double(), group).cpu()
    stats = MaskStats(
        n_valid=int(counts[0]),
        n_candidates=int(rows.shape[0]),
        n_masked=int(sel.sum()),
        n_nonfinite=int(counts[1]),
        tau_h=tau_h,
        masked_p_sum=float(rows[sel, 1].exp().sum()) if sel.any() else 0.0,
        masked_h_sum=float(rows[sel, 0].sum()) if sel.any() else 0.0,
    )
    return keep, stats


def top_entropy_keep_mask(entropy: torch.Tensor, response_mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """20-Entropy selection: keep the top ⌈ratio·N⌉ valid finite tokens by entropy (N = valid tokens here).

    Follows the official 80/20 code (``get_global_entropy_top_mask``: ``top_k = max(1, int(N*ρ + 0.9999))``,
    ``torch.topk``), applied to whatever population the caller passes (one micro-batch on one rank there).

    Args:
        entropy: (bs, T) float entropy in nats. response_mask: (bs, T) bool/int.
        ratio: ρ in (0, 1].
    Returns:
        keep bool (bs, T); all False when there is no valid finite token.
    Source: Wang et al. 2025 (arXiv 2506.01939) official code; spec §9.2, A18.
    """
    _check_shapes(entropy=entropy, response_mask=response_mask)
    ent = entropy.detach().float()
    usable = response_mask.bool() & torch.isfinite(ent)
    n = int(usable.sum())
    keep = torch.zeros_like(usable)
    if n == 0:
        return keep
    k = min(n, max(1, int(n * ratio + 0.9999)))
    flat_idx = usable.flatten().nonzero(as_tuple=True)[0]
    top = torch.topk(ent.flatten()[flat_idx], k).indices
    keep.view(-1)[flat_idx[top]] = True
    return keep
