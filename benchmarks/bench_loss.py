"""Benchmark: the actor's per-micro-batch loss path, verl ``vanilla`` vs STAPO as the plugin runs it in training.

Shape: Qwen3-8B output layer (hidden 4096 → vocab 151,936), ``--tokens`` response tokens (default 512).

* ``vanilla``: hidden @ W_lm → verl ``logprobs_from_logits`` → ``compute_policy_loss_vanilla`` → backward.
* ``stapo``  : what the default route (``stats_source=old_policy``) adds to an update — the S2T mask from the
  old-policy log-prob/entropy over the mini-batch (:func:`stapo_verl.core.losses.apply_policy_token_mask`,
  O(tokens), no entropy in the update) — then the same forward, verl's vanilla loss on the kept tokens
  (as :func:`stapo_verl.core.losses.ppo_loss` calls it) and backward.

Design (the difference measured is far below run-to-run noise, so the noise is what this script controls):

* Each sample is one fresh subprocess running one variant (1 small warm-up step, then ``--repeats`` timed
  full-size steps; its time is their median), so each sample's peak memory is its own: peak RSS (``ru_maxrss``) on CPU,
  ``torch.cuda.max_memory_allocated`` on CUDA. Peak memory is also reported as the step's increment over the
  process's memory right before its first step (the weights, inputs and the imported libraries are common to
  both variants and dilute the whole-process ratio).
* Samples are interleaved in ``--pairs`` pairs, the order alternating (A B, B A, A B, …) so a drift of the
  machine (other jobs, thermal state) and any first-of-the-pair effect hit both variants equally; each pair
  gives one ratio stapo/vanilla. Reported: the median per-pair ratio and its interquartile range (Q1–Q3), for
  time and for peak memory.
* S2T's own cost: the mask over one rank's share of a production mini-batch (default 64 prompts × 8 samples ×
  15,000 tokens over 16 DP ranks = 480,000 tokens, as 32 sequences × 15,000), per token, as a fraction of the
  lm-head forward + backward per token at the 8B shape (measured in the same subprocess at ``--tokens``). On one
  process the DP all-gather of the candidates is a no-op; at the paper's candidate rate (~1e-3 of tokens) it
  moves a few hundred floats per rank.

Also prints the loss-function-only ratio on 16 × 2048 tokens and the per-token cost of verl's chunked entropy
(``entropy_from_logits_with_chunking``) at this vocabulary (what ``actor.calculate_entropy=True`` makes verl compute
in every training forward; no token mask needs it).

Last line: ``stapo/vanilla time_ratio=<median> peak_mem_ratio=<median>`` (per-pair medians). Usage:
    python benchmarks/bench_loss.py [--pairs 10] [--repeats 1] [--tokens 512] [--device cpu|cuda]
                                    [--dtype fp32|bf16] [--quick]
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
# one DP rank's share of a production optimizer mini-batch (paper setup: 64 prompts x 8 samples, ~15k tokens,
# 16 DP ranks): 32 sequences x 15,000 tokens = 480,000 tokens.
RANK_SEQS, RANK_SEQ_LEN = 64 * 8 // 16, 15_000


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _actor_config(loss_mode):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    import stapo_verl.plugin  # noqa: F401  (the config class checks that the plugin is loaded)
    from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig

    pl = PolicyLossConfig(loss_mode="vanilla") if loss_mode == "vanilla" else StapoPolicyLossConfig(loss_mode="stapo")
    return ActorConfig(strategy="fsdp2", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_low=0.2,
                       clip_ratio_high=0.28, clip_ratio_c=10.0, policy_loss=pl, rollout_n=1)


def _batch(tokens, device, seed=0, bs=None):
    """Response-layout tensors (bs, tokens // bs) with a realistic spurious-candidate rate (~1e-3 of tokens)."""
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
    """What the plugin's pre-pass adds to an update (old-policy route): the S2T mask over the mini-batch.

    Returns ``(policy_loss_mask (bs, T), policy_batch_num_tokens)``."""
    from tensordict import TensorDict

    from stapo_verl.core.losses import POLICY_BATCH_NUM_TOKENS_KEY, POLICY_LOSS_MASK_KEY, apply_policy_token_mask

    mask = b["mask"]
    td = TensorDict({"old_log_probs": b["old"], "entropy": b["ent"], "advantages": b["adv"],
                     "response_mask": mask.clone(), "loss_mask": mask.clone()}, batch_size=[mask.shape[0]])
    apply_policy_token_mask(cfg, td, None)
    return td[POLICY_LOSS_MASK_KEY], int(td[POLICY_BATCH_NUM_TOKENS_KEY])


def _loss(fn, cfg, variant, b, log_prob, mask, num_tokens):
    """verl's policy loss; for ``stapo`` on the kept tokens only, as the plugin's ``ppo_loss`` calls it: inputs
    zeroed outside the mask, ``response_mask`` := K, and a shallow copy of the config whose
    ``global_batch_info["batch_num_tokens"]`` is Σ K."""
    import copy

    import torch

    rm = b["mask"].bool()
    kw = dict(old_log_prob=b["old"], log_prob=log_prob, advantages=b["adv"])
    if variant != "stapo":
        return fn(response_mask=rm, loss_agg_mode="token-mean", config=cfg, **kw)
    keep = rm & mask.bool()
    pg_cfg = copy.copy(cfg)
    object.__setattr__(pg_cfg, "global_batch_info", {**cfg.global_batch_info, "batch_num_tokens": max(num_tokens, 1)})
    kw = {key: torch.where(keep, value, 0.0) for key, value in kw.items()}
    return fn(response_mask=keep, loss_agg_mode="token-mean", config=pg_cfg, **kw)


def _current_rss_bytes():
    """Resident set size now (Linux ``/proc/self/statm``), the baseline the step's peak is compared with."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_variant(variant, tokens, repeats, device, dtype, warmup_tokens=64):
    """One variant in this (fresh) process: median step seconds, peak memory and the step's peak increment.

    The warm-up step runs on ``warmup_tokens`` rows (lazy initialisation of torch/verl/the plugin is what it
    absorbs; the big buffers — logits, W's gradient — are fresh allocations in every step anyway), so that a
    sample costs one full-size step, not two, on a loaded machine.

    Returns:
        ``{"time_s", "peak_bytes", "step_peak_bytes"}``: ``peak_bytes`` is the process's peak RSS (CPU) or peak
        allocated CUDA memory; ``step_peak_bytes`` is that peak minus the memory in use just before the first
        step (weights, inputs, libraries excluded).
    """
    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.torch_functional import logprobs_from_logits

    import stapo_verl.plugin  # noqa: F401  (registers the losses as the entry point does)

    torch.manual_seed(0)
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    w = (torch.randn(VOCAB, HIDDEN, device=device, dtype=dt) * 0.02).requires_grad_(True)
    cfg = _actor_config("stapo" if variant == "stapo" else "vanilla")
    fn = get_policy_loss_fn(cfg.policy_loss.loss_mode)

    def inputs(n):
        h = torch.randn(n, HIDDEN, device=device, dtype=dt).requires_grad_(True)
        return h, torch.randint(0, VOCAB, (n,), device=device), _batch(n, device)

    def step(h, labels, b):
        w.grad = h.grad = None
        _sync(device)
        t0 = time.perf_counter()
        mask, n = _s2t_mask(b, cfg) if variant == "stapo" else (None, None)
        cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(b["mask"].sum()), global_batch_size=1)
        logits = (h @ w.t()).float()
        log_prob = logprobs_from_logits(logits, labels).view(1, -1)
        loss, _ = _loss(fn, cfg, variant, b, log_prob, mask, n)
        loss.backward()
        _sync(device)
        return time.perf_counter() - t0

    step(*inputs(min(warmup_tokens, tokens)))
    full = inputs(tokens)
    w.grad = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _current_rss_bytes()
    times = [step(*full) for _ in range(repeats)]
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        # ru_maxrss (KiB on Linux) is the whole process's high-water mark; the warm-up step is far smaller, so
        # it is set by the full-size steps
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"time_s": statistics.median(times), "peak_bytes": peak, "step_peak_bytes": peak - base}


def s2t_cost(tokens, device, dtype, repeats=5):
    """S2T mask seconds/token over one rank's production share vs lm-head fwd+bwd seconds/token at the 8B shape.

    Returns:
        ``{"mask_tokens", "mask_s", "mask_s_per_token", "lm_head_s_per_token", "fraction"}``; both times are
        medians over ``repeats`` runs after one warm-up. The lm-head step is ``(h @ W.T)`` for ``tokens`` rows
        and its backward to ``h`` and ``W`` with a random upstream gradient (no log-softmax, no loss).
    """
    import torch

    import stapo_verl.plugin  # noqa: F401

    cfg = _actor_config("stapo")
    n = RANK_SEQS * RANK_SEQ_LEN
    b = _batch(n, device, seed=1, bs=RANK_SEQS)
    ts = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        _s2t_mask(b, cfg)
        _sync(device)
        ts.append(time.perf_counter() - t0)
    mask_s = statistics.median(ts[1:])
    del b
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    w = (torch.randn(VOCAB, HIDDEN, device=device, dtype=dt) * 0.02).requires_grad_(True)
    h = torch.randn(tokens, HIDDEN, device=device, dtype=dt).requires_grad_(True)
    g = torch.randn(tokens, VOCAB, device=device, dtype=dt)
    lt = []
    for _ in range(3):  # 1 warm-up + 2 timed
        w.grad = h.grad = None
        _sync(device)
        t0 = time.perf_counter()
        (h @ w.t()).backward(g)
        _sync(device)
        lt.append(time.perf_counter() - t0)
    lm = statistics.median(lt[1:]) / tokens
    return {"mask_tokens": n, "mask_s": mask_s, "mask_s_per_token": mask_s / n, "lm_head_s_per_token": lm,
            "fraction": (mask_s / n) / lm}


def loss_only_ratio(device, repeats=20):
    """Loss-function-only time (forward + backward on (16, 2048) log-probs): stapo (mask + loss) / vanilla."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import stapo_verl.plugin  # noqa: F401

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
            mask, n = _s2t_mask(b, cfg) if variant == "stapo" else (None, None)
            cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(b["mask"].sum()), global_batch_size=16)
            loss, _ = _loss(fn, cfg, variant, b, lp, mask, n)
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


def median_iqr(xs):
    """``(median, Q1, Q3)`` of ``xs`` (``statistics.quantiles``, inclusive method; needs ≥ 2 values)."""
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return med, q1, q3


def _child(args, job):
    """Run ``job`` (a variant name or ``extras``) in a fresh interpreter; return its last stdout line as JSON."""
    cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--device",
           args.device, "--dtype", args.dtype, "--_job", job]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"benchmark subprocess {job!r} failed (rc={r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    """CLI: interleaved subprocess pairs, then S2T cost and the extras; prints per-pair statistics and ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--pairs", type=int, default=10, help="interleaved vanilla/stapo subprocess pairs (>= 2)")
    ap.add_argument("--repeats", type=int, default=1, help="timed steps per subprocess after one warm-up")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default: fp32 on cpu, bf16 on cuda")
    ap.add_argument("--quick", action="store_true", help="short run: 3 pairs (statistics are then indicative only)")
    ap.add_argument("--_job", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    if a.quick:
        a.pairs = 3
    if a.tokens < 512:
        ap.error("--tokens must be at least 512 (a realistic micro-batch at the 8B output-layer shape)")
    if a.pairs < 2 or a.repeats < 1:
        ap.error(f"--pairs must be >= 2 (got {a.pairs}) and --repeats >= 1 (got {a.repeats})")
    if a._job in ("vanilla", "stapo"):
        print(json.dumps(run_variant(a._job, a.tokens, a.repeats, a.device, a.dtype)))
        return 0
    if a._job == "extras":
        out = s2t_cost(a.tokens, a.device, a.dtype)
        out["loss_only"] = loss_only_ratio(a.device)
        out["entropy_s_per_token"] = entropy_cost(a.tokens, a.device, a.dtype)
        print(json.dumps(out))
        return 0

    print(f"# hidden {HIDDEN} -> vocab {VOCAB}, {a.tokens} tokens, {a.dtype}, {a.device}; {a.pairs} interleaved "
          f"subprocess pairs, 1 small warm-up + {a.repeats} timed step(s) each")
    pairs = []
    for i in range(a.pairs):
        order = ("vanilla", "stapo") if i % 2 == 0 else ("stapo", "vanilla")
        res = {v: _child(a, v) for v in order}
        pairs.append(res)
        van, sta = res["vanilla"], res["stapo"]
        print(f"pair {i + 1:2d} ({order[0][0]}{order[1][0]}): vanilla {van['time_s']:8.3f} s "
              f"{van['peak_bytes'] / 2**30:6.3f} GiB (step +{van['step_peak_bytes'] / 2**30:.3f}) | stapo "
              f"{sta['time_s']:8.3f} s {sta['peak_bytes'] / 2**30:6.3f} GiB "
              f"(step +{sta['step_peak_bytes'] / 2**30:.3f})"
              f" | ratio time {sta['time_s'] / van['time_s']:.3f} mem {sta['peak_bytes'] / van['peak_bytes']:.4f}",
              flush=True)
    stats = {}
    for name, key in (("time", "time_s"), ("peak_mem", "peak_bytes"), ("step_peak_mem", "step_peak_bytes")):
        stats[name] = median_iqr([p["stapo"][key] / p["vanilla"][key] for p in pairs])
        print(f"per-pair stapo/vanilla {name:13s}: median {stats[name][0]:.4f}, IQR {stats[name][1]:.4f}–"
              f"{stats[name][2]:.4f}")
    for v in ("vanilla", "stapo"):
        t = median_iqr([p[v]["time_s"] for p in pairs])
        m = statistics.median(p[v]["peak_bytes"] for p in pairs)
        print(f"{v:8s} step time median {t[0]:.3f} s (IQR {t[1]:.3f}–{t[2]:.3f}), "
              f"peak memory median {m / 2**30:.3f} GiB")
    ex = _child(a, "extras")
    print(f"S2T mask over one rank's share ({RANK_SEQS} x {RANK_SEQ_LEN} = {ex['mask_tokens']} tokens): "
          f"{ex['mask_s'] * 1e3:.1f} ms = {ex['mask_s_per_token'] * 1e9:.1f} ns/token; lm-head fwd+bwd "
          f"({HIDDEN} -> {VOCAB}) {ex['lm_head_s_per_token'] * 1e3:.2f} ms/token; mask/lm-head per token = "
          f"{ex['fraction']:.2e}")
    lo = ex["loss_only"]
    print(f"loss-only 16x2048: vanilla={lo['vanilla'] * 1e3:.2f} ms stapo={lo['stapo'] * 1e3:.2f} ms "
          f"ratio={lo['stapo'] / lo['vanilla']:.3f}")
    per_tok = ex["entropy_s_per_token"]
    van_t = statistics.median(p["vanilla"]["time_s"] for p in pairs)
    print(f"verl chunked entropy at vocab {VOCAB}: {per_tok * 1e6:.1f} us/token "
          f"({per_tok * a.tokens / van_t:.3f}x of the vanilla step at {a.tokens} tokens; "
          "not paid by the default stats_source=old_policy)")
    print(f"stapo/vanilla time_ratio={stats['time'][0]:.3f} peak_mem_ratio={stats['peak_mem'][0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
