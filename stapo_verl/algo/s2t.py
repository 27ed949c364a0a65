"""S2T (Silencing Spurious Tokens) mask of STAPO: candidates, the entropy threshold τ_h, the keep mask.

STAPO: "Spurious-Token-Aware Policy Optimization" (https://arxiv.org/abs/2602.15620), §3 and Algorithm 1.
A response token (i, t) is *spurious* iff  Â_i > 0  and  p_{i,t} < τ_p  and  H_{i,t} < τ_h  (all strict), where
τ_h = Quantile_q(P) with linear interpolation over the candidate population
P = {H_{i,t} : valid, Â_i > 0, p_{i,t} < τ_p}, gathered over the data-parallel group. Spurious tokens, and valid
tokens whose log-prob or entropy is not finite, leave the policy-gradient term and its token-mean denominator.

Torch only. The exchange over the group the caller passes (``None``, or no process group: one process holds all) is
two tensor ``all_gather`` calls on the inputs' device: each rank's counts (candidates, valid, non-finite tokens),
then its candidate rows padded to the largest count (a few per response). The caller puts the inputs on the
group's device (for NCCL, the GPU), as verl's engines do with their token count.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def candidate_mask(log_prob, entropy, advantages, response_mask, tau_p: float) -> tuple[torch.Tensor, torch.Tensor]:
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


def gather_candidates(log_prob, entropy, response_mask, candidates, nonfinite, group=None):
    """The candidate population P of the whole group, with two tensor ``all_gather`` calls on the inputs' device.

    Args:
        log_prob, entropy, response_mask: (bs, T), as in :func:`candidate_mask`; candidates, nonfinite: its output.
        group: the data-parallel group whose ranks together hold the mini-batch (each token on one rank), or None.

    Returns:
        ``(rows, offset, n_valid, n_nonfinite)``: rows (|P|, 2) float32 on the inputs' device, (H, log p) of the
        candidates of every rank in rank order; the index of this rank's first row; the group's valid and non-finite
        token counts (ints).
    """
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
    """Keep mask K = valid ∧ finite ∧ ¬spurious for this rank's share of one optimizer mini-batch.

    The candidates are gathered over ``group`` before τ_h is taken, so every rank applies the same τ_h and K does not
    depend on how the mini-batch is split over ranks or micro-batches.

    Args:
        log_prob, entropy, advantages, response_mask: (bs, T), as in :func:`candidate_mask`, on the device of
            ``group``'s collectives.
        tau_p: τ_p (paper: 0.002). q: entropy quantile, 0 < q <= 1 (paper: 0.75). group: see
            :func:`gather_candidates`.

    Returns:
        ``(keep, metrics)``: keep (bs, T) bool on the device of ``log_prob``; metrics as :func:`s2t_metrics`.

    Raises:
        ValueError: the inputs do not share one shape. RuntimeError: |P| > 2^24 (``torch.quantile``'s limit).

    Source: STAPO paper §3 and Algorithm 1 (τ_h: ``torch.quantile``, linear), generalised to data parallelism.
    """
    candidates, nonfinite = candidate_mask(log_prob, entropy, advantages, response_mask, tau_p)
    rows, offset, n_valid, n_nonfinite = gather_candidates(
        log_prob, entropy, response_mask, candidates, nonfinite, group
    )
    tau_h = float(torch.quantile(rows[:, 0], q)) if len(rows) else None
    silenced = rows[:, 0] < tau_h if tau_h is not None else torch.zeros(0, dtype=torch.bool, device=rows.device)
    spurious = torch.zeros_like(candidates)
    spurious[candidates] = silenced[offset : offset + int(candidates.sum())].to(candidates.device)
    return response_mask.bool() & ~nonfinite & ~spurious, s2t_metrics(rows, silenced, n_valid, n_nonfinite, tau_h)
