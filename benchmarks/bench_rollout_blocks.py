"""Benchmark: the cost of the rollout server's fixed-size row blocks against one model call over all rows.

:class:`stapo_verl.cpu.rollout_server.HFGenerator` cuts the requests of a batch into blocks of ``block_rows`` rows
(dummy rows fill the last) and decodes each block on its own, so the shapes the model sees do not depend on how
many requests arrived together (batch invariance whatever the CPU's kernels). ``block_rows=0`` is the earlier
server: every batch of 8 or more requests as one call of its own number of rows (batch-invariant only where the
CPU's kernels happen to be). This script times both on the tiny assets' model (``stapo_verl.cpu.make_assets``) with the tiny recipe's shapes (prompts padded to 128, up to 40 sampled tokens, one seed per
request), variants interleaved in each repetition, and prints per batch size the median seconds of each variant
and the median ratio to ``block_rows=0`` with its min-max over the repetitions.

Usage: ``python benchmarks/bench_rollout_blocks.py [--reps 5] [--batches 16,64,128] [--blocks 0,8,16,32]
[--threads 2]`` (not part of the test suite; about 3 minutes on 2 idle cores).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batches", default="16,64,128", help="numbers of concurrent requests")
    ap.add_argument("--blocks", default="0,8,16,32", help="block_rows variants; the first is the reference")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--response-length", type=int, default=40)
    a = ap.parse_args()

    import pandas as pd
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_verl.cpu import make_assets as M
    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings

    torch.set_num_threads(a.threads)
    assets = M.default_dir()
    model_dir = assets / "model"
    if not model_dir.is_dir():
        raise SystemExit(f"no tiny assets at {assets}: build them with `python -m stapo_verl.cpu.make_assets`")
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    rows = pd.read_parquet(assets / "data" / "train.parquet").head(max(int(b) for b in a.batches.split(",")))
    prompts = [M.encode_chat(tok, r["prompt"][0]["content"]) for _, r in rows.iterrows()]
    blocks = [int(b) for b in a.blocks.split(",")]
    settings = SamplingSettings(temperature=1.0, logprobs=True)
    gens = {b: HFGenerator(model, M.stop_ids(tok), tok.pad_token_id, pad_to=a.prompt_length, block_rows=b)
            for b in blocks}
    print(f"tiny model ({sum(p.numel() for p in model.parameters())} parameters), {a.threads} threads, "
          f"prompts padded to {a.prompt_length}, up to {a.response_length} tokens, {a.reps} interleaved repetitions "
          f"(assets {assets})")
    for n in (int(b) for b in a.batches.split(",")):
        times = {b: [] for b in blocks}
        for _rep in range(a.reps):
            for b in blocks:
                t0 = time.perf_counter()
                gens[b].generate(prompts[:n], [a.response_length] * n, settings, list(range(n)))
                times[b].append(time.perf_counter() - t0)
        ref = times[blocks[0]]
        for b in blocks:
            ratios = [t / r for t, r in zip(times[b], ref)]
            print(f"  {n:4d} requests  block_rows={b:<3d} median {statistics.median(times[b]):6.3f} s   ratio to "
                  f"block_rows={blocks[0]}: median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, "
                  f"max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
