"""Data-parallel collectives for the S2T candidate population and token counts.

All collectives run inside the DP group verl hands to the loss (``dp_group``) or returns from
``engine.get_data_parallel_group()``; that group excludes TP/PP/CP replicas, so every logical token is
counted once (verl_notes §7, bug D3). ``group=None`` or an uninitialised process group means "this process
holds the whole population" (DP = 1, unit tests).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _active(group) -> bool:
    return group is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def group_world_size(group) -> int:
    """Number of ranks in ``group`` (1 when ``group`` is None or torch.distributed is not initialised)."""
    return dist.get_world_size(group) if _active(group) else 1


def all_reduce_sum(t: torch.Tensor, group) -> torch.Tensor:
    """Sum ``t`` over ``group`` (returns a new tensor; the input is untouched).

    Args:
        t: any-shape tensor; float64 is recommended for counts so sums stay exact.
        group: DP process group or None.
    Returns:
        Tensor of the same shape and dtype holding the group-wide sum.
    """
    out = t.detach().clone()
    if _active(group):
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather_rows(rows: torch.Tensor, group) -> tuple[torch.Tensor, list[int]]:
    """Variable-length all-gather of a (n_local, C) tensor, concatenated in rank order.

    Every rank receives the same (n_global, C) tensor, so a deterministic selection over it (quantile,
    seeded permutation) agrees on every rank (bug D8). Rows are padded to the largest local count with
    zeros and trimmed with the exchanged sizes, so no sentinel value can collide with real data.

    Args:
        rows: (n_local, C) float tensor (n_local may be 0).
        group: DP process group or None.
    Returns:
        (gathered (n_global, C), sizes list[int] with one local count per rank, in rank order).
    """
    if not _active(group):
        return rows, [rows.shape[0]]
    world = dist.get_world_size(group)
    n = torch.tensor([rows.shape[0]], dtype=torch.int64, device=rows.device)
    sizes_t = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes_t, n, group=group)
    sizes = [int(s.item()) for s in sizes_t]
    width = max(max(sizes), 1)
    buf = torch.zeros((width, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    buf[: rows.shape[0]] = rows
    out = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(out, buf, group=group)
    gathered = torch.cat([o[:s] for o, s in zip(out, sizes, strict=True)], dim=0)
    return gathered, sizes


def group_rank(group) -> int:
    """Rank of this process inside ``group`` (0 when inactive)."""
    return dist.get_rank(group) if _active(group) else 0
