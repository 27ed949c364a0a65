"""Benchmark: the S2T mask's data-parallel exchange, before and after it became a tensor collective.

Before (``--before``, default the last commit with it, ``f0578da``): ``gather_candidates`` sent each rank's candidate
rows as float64 CPU tensors (``.double().cpu()``, a device-to-host copy on a GPU) with its token counts in one
``torch.distributed.all_gather_object`` (pickled, plus the object collective's own size exchange). After (this
tree's :func:`stapo_verl.algo.s2t.gather_candidates`): two tensor ``all_gather`` calls on the inputs' device, the
counts (3 int64) and then the candidate rows (float32) padded to the largest count.

Shape: one DP rank's share of a production optimizer mini-batch (``bench_loss.py``: 32 sequences × 15,000 tokens,
p < τ_p on about 1e-3 of the tokens, a quarter of the sequences with Â < 0), the paper's τ_p = 0.002 and q = 0.75,
on ``--ranks`` gloo processes on this machine (each with its own share, seeded by its rank). Timed per rank, wall
clock after a barrier, the four components interleaved in every repeat (so a drift of the machine hits all alike):
the gather alone and the whole keep mask (:func:`stapo_verl.algo.s2t.s2t_keep_mask`), before and after. The two
implementations are first checked to give the same rows, keep mask and metrics. Printed: the median and
interquartile range in ms per mini-batch, the after/before ratios, and the bytes each rank sends.

On gloo the saving is the pickling and the object collective's extra size exchange; on NCCL the before path also
copied the rows to the host (a synchronisation) and back, which this CPU benchmark cannot show.

Usage: ``python benchmarks/bench_exchange.py [--before REF] [--repeats 30] [--ranks 2]``
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loss import RANK_SEQ_LEN, RANK_SEQS, _batch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TAU_P, Q = 0.002, 0.75


def load_before(ref: str) -> types.ModuleType:
    """``stapo_verl/algo/s2t.py`` as it was at git ``ref``, as a module of its own.

    Raises:
        subprocess.CalledProcessError: ``ref`` or the file at it does not exist.
    """
    text = subprocess.check_output(["git", "show", f"{ref}:stapo_verl/algo/s2t.py"], cwd=REPO, text=True)
    module = types.ModuleType("s2t_before")
    exec(compile(text, f"{ref}:stapo_verl/algo/s2t.py", "exec"), module.__dict__)  # noqa: S102
    return module


def _share(rank: int):
    import torch

    b = _batch(RANK_SEQS * RANK_SEQ_LEN, "cpu", seed=1 + rank, bs=RANK_SEQS)
    b["adv"] = b["adv"] * torch.where(torch.arange(RANK_SEQS) % 4 != 3, 1.0, -1.0)[:, None]
    return b["old"], b["ent"], b["adv"], b["mask"]


def _child(rank: int, world: int, port: int, ref: str, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    from stapo_verl.algo import s2t as after

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        before = load_before(ref)
        lp, ent, adv, rm = _share(rank)
        cand, nonfinite = after.candidate_mask(lp, ent, adv, rm, TAU_P)
        group = dist.group.WORLD
        rows_b, *counts_b = before.gather_candidates(lp, ent, rm, cand, nonfinite, group)[:4]
        rows_a, mine_a, _, *counts_a = after.gather_candidates(lp, ent, rm, cand, nonfinite, group)
        counts_a = [mine_a.start, *counts_a]  # as the earlier return: (offset, n_valid, n_nonfinite)
        keep_b, metrics_b = before.s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=Q, group=group)
        keep_a, metrics_a = after.s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=Q, group=group)
        same = (torch.equal(rows_b.float(), rows_a) and counts_b == counts_a and torch.equal(keep_a, keep_b)
                and metrics_a == metrics_b)
        components = {
            "gather, before": lambda: before.gather_candidates(lp, ent, rm, cand, nonfinite, group),
            "gather, after": lambda: after.gather_candidates(lp, ent, rm, cand, nonfinite, group),
            "keep mask, before": lambda: before.s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=Q, group=group),
            "keep mask, after": lambda: after.s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=Q, group=group),
        }
        times = {name: [] for name in components}
        for repeat in range(repeats + 1):  # the first repeat warms up
            for name, fn in components.items():
                dist.barrier(group)
                t0 = time.perf_counter()
                fn()
                if repeat:
                    times[name].append((time.perf_counter() - t0) * 1e3)
        n = int(cand.sum())
        local = torch.stack([ent.float()[cand], lp.float()[cand]], dim=1)
        largest = torch.tensor(n)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
        sent = {"before": len(pickle.dumps((local.double(), int(rm.sum()), int(nonfinite.sum()), None))),
                "after": 3 * 8 + max(int(largest), 1) * 2 * 4}  # the counts, then the rows padded to the largest
        queue.put((rank, {"times": times, "same": same, "candidates": n, "rows": int(rows_a.shape[0]),
                          "sent": sent}))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main(argv=None) -> int:
    """CLI: runs the ranks, prints one line per component and the after/before ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="f0578da", help="git ref of the all_gather_object exchange")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--ranks", type=int, default=2)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    load_before(a.before)  # fails here, before any process starts, on a bad ref
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(r, a.ranks, port, a.before, a.repeats, queue)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    if not all(r["same"] for r in results.values()):
        print("bench_exchange: before and after DIFFER (rows, counts, keep mask or metrics)", file=sys.stderr)
        return 1
    print(f"bench_exchange: {a.ranks} gloo ranks, {RANK_SEQS} × {RANK_SEQ_LEN} tokens each, candidates per rank "
          f"{[results[r]['candidates'] for r in sorted(results)]} ({results[0]['rows']} gathered), {a.repeats} "
          f"repeats; before = {a.before}; rows, counts, keep mask and metrics identical")
    for rank in sorted(results):
        times = results[rank]["times"]
        for name, values in times.items():
            lo, med, hi = _quartiles(values)
            print(f"  rank {rank}  {name:<18} median {med:7.3f} ms  (IQR {lo:.3f}–{hi:.3f})")
        sent = results[rank]["sent"]
        print(f"  rank {rank}  bytes sent: before {sent['before']} (pickled), after {sent['after']}")
        for what in ("gather", "keep mask"):
            ratio = statistics.median(times[f"{what}, after"]) / statistics.median(times[f"{what}, before"])
            print(f"  rank {rank}  {what}: after / before = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
