"""S2T mask of STAPO (https://arxiv.org/abs/2602.15620, §3, Algorithm 1); torch only.

Token (i, t) is spurious iff Â_i > 0, p_{i,t} < τ_p and H_{i,t} < τ_h = Quantile_q(P) (linear), P the entropies of
the valid candidates (Â > 0, p < τ_p) over the data-parallel group. Spurious tokens and valid non-finite ones leave
the policy-gradient term and its token-mean denominator. The group exchange is two tensor ``all_gather`` calls on the
inputs' device (the caller puts them on the group's device, as verl's engines do with their token count).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def candidate_mask(log_prob, entropy, advantages, response_mask, tau_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates P (valid, finite, Â > 0, log p < ln τ_p; paper §3) and the valid non-finite tokens, (bs, T) bool.

    ``log_prob`` (log p of the sampled token), ``entropy`` (nats), ``advantages``: (bs, T) float, read detached in
    fp32; ``response_mask``: (bs, T) bool or int. Raises ValueError when the four shapes differ.
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


def gather_candidates(log_prob, entropy, response_mask, candidates, nonfinite, group=None):
    """P over ``group`` (None: this process holds all): ``(rows, offset, n_valid, n_nonfinite)``, rows (|P|, 2)
    float32 (H, log p) of every rank's candidates in rank order, ``offset`` this rank's first row, and the group's
    valid and non-finite token counts. Inputs (bs, T) as in :func:`candidate_mask` and its outputs."""
    rows = torch.stack([entropy.detach().float()[candidates], log_prob.detach().float()[candidates]], dim=1)
    counts = torch.stack([candidates.sum(), response_mask.bool().sum(), nonfinite.sum()]).to(rows.device)
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        n_valid, n_nonfinite = (int(c) for c in counts[1:].tolist())
        return rows, 0, n_valid, n_nonfinite
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(all_counts, counts, group=group)
    table = torch.stack(all_counts).tolist()  # (world, 3): the one device-to-host copy
    sizes = [row[0] for row in table]
    padded = rows.new_zeros(max(max(sizes), 1), 2)
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    rows = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])
    return rows, sum(sizes[:rank]), sum(row[1] for row in table), sum(row[2] for row in table)


def s2t_metrics(rows, silenced, n_valid: int, n_nonfinite: int, tau_h: float | None) -> dict[str, float]:
    """The mask's metrics under ``actor/stapo/``, global over the group: masked_frac and candidate_frac (of the valid
    tokens), num_masked, num_candidates, nonfinite_tokens, renorm_factor (valid / kept tokens), and when defined tau_h
    (nats), masked_p_mean and masked_entropy_mean (over the silenced tokens). ``rows``: :func:`gather_candidates`'s;
    ``silenced``: (|P|,) bool."""
    n_masked, prefix = int(silenced.sum()), "actor/stapo/"
    metrics = {
        prefix + "masked_frac": n_masked / max(n_valid, 1),
        prefix + "candidate_frac": rows.shape[0] / max(n_valid, 1),
        prefix + "num_masked": float(n_masked),
        prefix + "num_candidates": float(rows.shape[0]),
        prefix + "nonfinite_tokens": float(n_nonfinite),
        prefix + "renorm_factor": n_valid / max(n_valid - n_masked - n_nonfinite, 1),
    }
    if tau_h is not None:
        metrics[prefix + "tau_h"] = float(tau_h)
    if n_masked > 0:
        metrics[prefix + "masked_p_mean"] = float(rows[silenced, 1].double().exp().mean())
        metrics[prefix + "masked_entropy_mean"] = float(rows[silenced, 0].double().mean())
    return metrics


def s2t_keep_mask(log_prob, entropy, advantages, response_mask, *, tau_p=0.002, q=0.75, group=None):
    """Keep mask K = valid ∧ finite ∧ ¬spurious, (bs, T) bool, and :func:`s2t_metrics`, for this rank's share of an
    optimizer mini-batch (paper §3, Algorithm 1; τ_p = 0.002, q = 0.75 there). P is gathered over ``group`` before
    τ_h is taken, so K does not depend on the DP or micro-batch split. Inputs as in :func:`candidate_mask`, on the
    group's device. Raises ValueError (shapes), RuntimeError (|P| > 2^24, ``torch.quantile``'s limit)."""
    candidates, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    rows, offset, n_valid, n_nonfinite = gather_candidates(
        log_prob, entropy, response_mask, candidates, nonfinite, group
    )
    tau_h = float(torch.quantile(rows[:, 0], q)) if len(rows) else None
    silenced = rows[:, 0] < tau_h if tau_h is not None else torch.zeros(0, dtype=torch.bool, device=rows.device)
    spurious = torch.zeros_like(candidates)
    spurious[candidates] = silenced[offset : offset + int(candidates.sum())].to(candidates.device)
    return response_mask.bool() & ~nonfinite & ~spurious, s2t_metrics(rows, silenced, n_valid, n_nonfinite, tau_h)
