"""Benchmark: the actor's per-micro-batch loss path, verl ``vanilla`` vs STAPO as the plugin runs it in training.

Shape: Qwen3-8B output layer (hidden 4096 → vocab 151,936), ``--tokens`` response tokens (default 512).
Each variant runs in its own subprocess so its peak RSS (CPU) / peak allocated memory (CUDA) is its own:

* ``vanilla``: hidden @ W_lm → verl ``logprobs_from_logits`` → ``compute_policy_loss_vanilla`` → backward.
* ``stapo``  : what the default route (``stats_source=old_policy``) adds to an update — the S2T mask from the
  old-policy log-prob/entropy over the mini-batch (``apply_s2t_to_minibatch``, O(tokens), no entropy in the
  update) — then the same forward, the registered ``stapo`` loss and backward.

Also prints the loss-function-only ratio on 16 × 2048 tokens and the per-token cost of verl's chunked entropy
(``entropy_from_logits_with_chunking``) at this vocabulary (what ``stats_source=current_micro_batch`` and
``top_entropy`` make verl compute in every training forward).

Last line: ``stapo/vanilla time_ratio=<x> peak_mem_ratio=<y>``. Usage:
    python benchmarks/bench_loss.py [--tokens 512] [--repeats 3] [--device cpu|cuda] [--dtype fp32|bf16]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

HIDDEN, VOCAB = 4096, 151_936


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _actor_config(loss_mode):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    from stapo_verl.config import StapoPolicyLossConfig

    pl = PolicyLossConfig(loss_mode="vanilla") if loss_mode == "vanilla" else StapoPolicyLossConfig(loss_mode="stapo")
    return ActorConfig(strategy="fsdp2", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                       clip_ratio_high=0.28, clip_ratio_c=10.0, policy_loss=pl, rollout_n=1)


def _batch(tokens, device, seed=0, bs=None):
    """Response-layout tensors with a realistic spurious-candidate rate (~1e-3 of tokens)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    bs = bs or 1
    T = tokens // bs
    old = -torch.rand(bs, T, generator=g) * 2
    rare = torch.rand(bs, T, generator=g) < 1e-3
    old = torch.where(rare, torch.full_like(old, -9.0), old)
    ent = torch.rand(bs, T, generator=g) * 3
    adv = torch.randn(bs, 1, generator=g).abs().expand(bs, T).contiguous()
    mask = torch.ones(bs, T, dtype=torch.int64)
    return {k: v.to(device) for k, v in dict(old=old, ent=ent, adv=adv, mask=mask).items()}


def _s2t_mask(b, cfg):
    """What the plugin's worker hook adds to an update (old-policy route): the S2T mask over the mini-batch."""
    from tensordict import TensorDict

    from stapo_verl.worker_hooks import apply_s2t_to_minibatch

    mask = b["mask"]
    td = TensorDict({"old_log_probs": b["old"], "entropy": b["ent"], "advantages": b["adv"],
                     "response_mask": mask.clone(), "loss_mask": mask.clone()}, batch_size=[mask.shape[0]])
    stats = apply_s2t_to_minibatch(td, cfg.policy_loss, None)
    return td["response_mask"], stats


def run_variant(variant, tokens, repeats, device, dtype):
    """One variant in this process; returns median seconds and peak memory in bytes."""
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.torch_functional import logprobs_from_logits

    import stapo_verl.plugin  # noqa: F401  (registers the losses as the entry point does)
    from stapo_verl import state

    torch.manual_seed(0)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    w = (torch.randn(VOCAB, HIDDEN, device=device, dtype=dt) * 0.02).requires_grad_(True)
    h = torch.randn(tokens, HIDDEN, device=device, dtype=dt).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (tokens,), device=device)
    cfg = _actor_config("stapo" if variant == "stapo" else "vanilla")
    fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
    b = _batch(tokens, device)
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats + 1):  # first iteration is warm-up
        w.grad = h.grad = None
        _sync(device)
        t0 = time.perf_counter()
        mask, stats = _s2t_mask(b, cfg) if variant == "stapo" else (b["mask"], None)
        cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=1)
        logits = (h @ w.t()).float()
        log_prob = logprobs_from_logits(logits, labels).view(1, -1)
        state.MINIBATCH.start(stats)
        try:
            loss, _ = fn(old_log_prob=b["old"], log_prob=log_prob, advantages=b["adv"], response_mask=mask.bool(),
                         loss_agg_mode="token-mean", config=cfg)
        finally:
            state.MINIBATCH.end()
        loss.backward()
        _sync(device)
        times.append(time.perf_counter() - t0)
        del logits, log_prob, loss
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"time_s": statistics.median(times[1:]), "peak_bytes": peak}


def loss_only_ratio(device, repeats=20):
    """Loss-function-only time (forward + backward on (16, 2048) log-probs): stapo (mask + loss) / vanilla."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import stapo_verl.plugin  # noqa: F401
    from stapo_verl import state

    b = _batch(16 * 2048, device, bs=16)
    res = {}
    for variant in ("vanilla", "stapo"):
        cfg = _actor_config(variant)
        fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)
        ts = []
        for _ in range(repeats + 2):
            lp = (b["old"] + 0.05).requires_grad_(True)
            _sync(device)
            t0 = time.perf_counter()
            mask, stats = _s2t_mask(b, cfg) if variant == "stapo" else (b["mask"], None)
            cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=16)
            state.MINIBATCH.start(stats)
            try:
                loss, _ = fn(old_log_prob=b["old"], log_prob=lp, advantages=b["adv"], response_mask=mask.bool(),
                             loss_agg_mode="token-mean", config=cfg)
            finally:
                state.MINIBATCH.end()
            loss.backward()
            _sync(device)
            ts.append(time.perf_counter() - t0)
        res[variant] = statistics.median(ts[2:])
    return res


def entropy_cost(tokens, device, dtype, chunk=2048):
    """Seconds per token of verl's ``entropy_from_logits_with_chunking`` on (tokens, 151936) logits, no grad."""
    import torch
    from verl.utils.torch_functional import entropy_from_logits_with_chunking

    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    logits = torch.randn(tokens, VOCAB, device=device, dtype=dt)
    ts = []
    with torch.no_grad():
        for _ in range(3):
            _sync(device)
            t0 = time.perf_counter()
            entropy_from_logits_with_chunking(logits, chunk_size=chunk)
            _sync(device)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / tokens


def main(argv=None):
    """CLI: run both variants in subprocesses, print times, peak memory and ratios (see module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on cpu, bf16 on cuda")
    ap.add_argument("--_variant", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    if a.tokens < 512:
        ap.error("--tokens must be at least 512 (the issue's minimum at the 8B output-layer shape)")
    if a._variant:
        print(json.dumps(run_variant(a._variant, a.tokens, a.repeats, a.device, a.dtype)))
        return 0
    res = {}
    for variant in ("vanilla", "stapo"):
        cmd = [sys.executable, __file__, "--tokens", str(a.tokens), "--repeats", str(a.repeats), "--device", a.device,
               "--dtype", a.dtype, "--_variant", variant]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        res[variant] = json.loads(out)
        print(f"{variant:8s} time={res[variant]['time_s'] * 1e3:9.1f} ms  peak_mem={res[variant]['peak_bytes'] / 2**30:7.3f} GiB"
              f"  (hidden {HIDDEN} -> vocab {VOCAB}, {a.tokens} tokens, {a.dtype}, {a.device})")
    lo = loss_only_ratio(a.device)
    print(f"loss-only 16x2048: vanilla={lo['vanilla'] * 1e3:.2f} ms stapo={lo['stapo'] * 1e3:.2f} ms "
          f"ratio={lo['stapo'] / lo['vanilla']:.3f}")
    per_tok = entropy_cost(a.tokens, a.device, a.dtype)
    print(f"verl chunked entropy at vocab {VOCAB}: {per_tok * 1e6:.1f} us/token "
          f"({per_tok * a.tokens / res['vanilla']['time_s']:.3f}x of the vanilla step at {a.tokens} tokens; "
          "not paid by the default stats_source=old_policy)")
    t = res["stapo"]["time_s"] / res["vanilla"]["time_s"]
    m = res["stapo"]["peak_bytes"] / res["vanilla"]["peak_bytes"]
    print(f"stapo/vanilla time_ratio={t:.3f} peak_mem_ratio={m:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
