"""S2T mask of STAPO (https://arxiv.org/abs/2602.15620, §3, Algorithm 1); torch only. Token (i, t) is spurious iff
Â_i > 0, p_{i,t} < τ_p and H_{i,t} < τ_h = Quantile_q(P), P the entropies of the valid candidates (Â > 0, p < τ_p)
over the data-parallel group; spurious and valid non-finite tokens leave the policy-gradient term and its token-mean
denominator. Two tensor ``all_gather`` calls on the inputs' device; two device reads: the group's counts, the metrics.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def below_tau_p(log_prob: torch.Tensor, tau_p: float) -> torch.Tensor:
    """The candidate rule p < τ_p (paper §3) as log p < ln τ_p in fp32, any shape, bool (NaN: False)."""
    return log_prob.detach().float() < math.log(tau_p)


def candidate_mask(log_prob, entropy, advantages, response_mask, tau_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates P (valid, finite, Â > 0, p < τ_p; paper §3) and the valid non-finite tokens, (bs, T) bool.
    ``log_prob`` (of the sampled token), ``entropy`` (nats), ``advantages``: (bs, T) float, read detached in fp32;
    ``response_mask``: (bs, T) bool or int. Raises ValueError when the four shapes differ."""
    shapes = {tuple(t.shape) for t in (log_prob, entropy, advantages, response_mask)}
    if len(shapes) != 1:
        raise ValueError(f"S2T inputs must share one (batch, response_len) shape, got {sorted(shapes)}")
    lp = log_prob.detach().float()
    valid = response_mask.bool()
    finite = torch.isfinite(lp) & torch.isfinite(entropy.detach().float())
    adv = torch.nan_to_num(advantages.detach().float(), nan=0.0)
    return valid & finite & (adv > 0) & below_tau_p(lp, tau_p), valid & ~finite


def gather_candidates(log_prob, entropy, response_mask, candidates, nonfinite, group=None):
    """P over ``group`` (None: this process holds all): ``(rows, mine, index, n_valid, n_nonfinite)``: rows (|P|, 2)
    float32 (H, log p) of all ranks' candidates in rank order, ``mine`` this rank's slice, ``index`` their flat (int64)
    positions in the (bs, T) inputs, the group's valid and non-finite token counts (ints). Inputs (bs, T) as in
    :func:`candidate_mask` and its outputs. One device-to-host copy: the group's counts."""
    counts = torch.stack([candidates.sum(), response_mask.bool().sum(), nonfinite.sum()])
    distributed = group is not None and dist.is_initialized() and dist.get_world_size(group) > 1
    if distributed:
        all_counts = [torch.empty_like(counts) for _ in range(dist.get_world_size(group))]
        dist.all_gather(all_counts, counts, group=group)
        counts = torch.stack(all_counts)
    table = counts.reshape(-1, 3).tolist()  # (world, 3): the one device-to-host copy
    rank = dist.get_rank(group) if distributed else 0
    sizes = [row[0] for row in table]
    index = torch.nonzero_static(candidates.reshape(-1), size=sizes[rank]).reshape(-1)  # size known: no sync
    rows = torch.stack([entropy.detach().float().reshape(-1)[index], log_prob.detach().float().reshape(-1)[index]], 1)
    if distributed:
        padded = rows.new_zeros(max(max(sizes), 1), 2)
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        rows = torch.cat([part[:size] for part, size in zip(parts, sizes, strict=True)])
    start = sum(sizes[:rank])
    mine = slice(start, start + sizes[rank])
    return rows, mine, index, sum(row[1] for row in table), sum(row[2] for row in table)


def s2t_metrics(rows, silenced, n_valid: int, n_nonfinite: int, tau_h) -> dict[str, float]:
    """Metrics under ``actor/stapo/``, global over the group: masked_frac, candidate_frac (of the valid tokens),
    num_masked, num_candidates, nonfinite_tokens, renorm_factor (valid / kept tokens), tau_h (nats; given unless None:
    0-d tensor or float). ``rows``: :func:`gather_candidates`'s; ``silenced``: (|P|,) bool. One device-to-host copy."""
    tau = torch.as_tensor(math.nan if tau_h is None else tau_h, dtype=torch.float64, device=rows.device).reshape(())
    n_masked, tau = torch.stack([silenced.to(rows.device).sum().double(), tau]).tolist()
    n_masked, prefix = int(n_masked), "actor/stapo/"
    metrics = {
        prefix + "masked_frac": n_masked / max(n_valid, 1),
        prefix + "candidate_frac": rows.shape[0] / max(n_valid, 1),
        prefix + "num_masked": float(n_masked),
        prefix + "num_candidates": float(rows.shape[0]),
        prefix + "nonfinite_tokens": float(n_nonfinite),
        prefix + "renorm_factor": n_valid / max(n_valid - n_masked - n_nonfinite, 1),
    }
    if tau_h is not None:
        metrics[prefix + "tau_h"] = tau
    return metrics


def keep_from_silenced(candidates, nonfinite, response_mask, silenced, mine, index) -> torch.Tensor:
    """K = valid ∧ ¬non-finite ∧ ¬silenced, (bs, T) bool (``mine``, ``index``: :func:`gather_candidates`'s)."""
    spurious = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    spurious[index] = silenced[mine].to(candidates.device)
    return response_mask.bool() & ~nonfinite & ~spurious.reshape(candidates.shape)


def s2t_keep_mask(log_prob, entropy, advantages, response_mask, *, tau_p=0.002, q=0.75, group=None):
    """Keep mask K = valid ∧ finite ∧ ¬spurious, (bs, T) bool, and :func:`s2t_metrics`, for this rank's share of an
    optimizer mini-batch (paper §3, Algorithm 1; τ_p = 0.002, q = 0.75 there). τ_h = ``torch.quantile(P, q)`` (linear)
    of P gathered over ``group``: K is independent of the DP and micro-batch split. Inputs as in :func:`candidate_mask`,
    on the group's device. Raises ValueError (shapes); RuntimeError unless |P| ≤ 2^24, torch.quantile's limit."""
    candidates, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    rows, mine, index, n_valid, n_nonfinite = gather_candidates(
        log_prob, entropy, response_mask, candidates, nonfinite, group
    )
    tau_h = torch.quantile(rows[:, 0], q) if len(rows) else None
    silenced = rows[:, 0] < tau_h if tau_h is not None else torch.zeros(0, dtype=torch.bool, device=rows.device)
    keep = keep_from_silenced(candidates, nonfinite, response_mask, silenced, mine, index)
    return keep, s2t_metrics(rows, silenced, n_valid, n_nonfinite, tau_h)
