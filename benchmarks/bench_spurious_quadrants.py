"""Benchmark: STAPO's gradient-norm and entropy claims (arXiv 2602.15620 §3) measured on the tiny run's batches.

Not part of the test suite (a few minutes on 2 cores, in one process, no Ray). Two measurements:

1. **The quadrant table.** The positive-advantage tokens of ``--batches`` real training batches (the tiny run's
   steps 1, 2, …: its prompts, its per-request rollout seeds, its scorer, verl's GRPO advantages; see
   ``benchmarks/tiny_policy.py``), split at the S2T mask's thresholds into probability low / high (p < τ_p) ×
   entropy low / high (H < τ_h, τ_h = Quantile_q of the candidates' entropies, per batch). Per quadrant: token
   count, mean p and H, the mean EXACT norm ||∇_a log p|| = sqrt(1 − 2p + Σ π²) of the PG term's gradient with
   respect to the logits (Σ π² from the full next-token distribution, verl's
   ``calculate_sum_pi_squared_from_logits``) at unit weight, the means of Theorem 3.1's bounds on it
   (``stapo_verl.diagnostics.stats.logit_grad_norm_sq_bounds``), the advantage-weighted mean |Â| · norm, and the
   low-p/low-H quadrant's excess over high-p/high-H (the paper's v1 figure 2b: +16.7 %).
2. **The entropy claim.** For each batch, from the same weights: one optimizer step of the tiny run's actor (verl's
   ``compute_policy_loss_vanilla``, token-mean, clip 0.2 / 0.28, dual clip 10; AdamW from verl's
   ``build_optimizer`` with lr 2e-4, weight decay 0.1, gradient clip 1.0: the recipe's settings) with every valid
   token ("with"), and the same step without the tokens the S2T mask silences (τ_p = the first ``--tau-p``, q;
   the PG token-mean renormalised over the kept tokens, as the plugin does). Then the mean entropy on held-out
   prompts: ``--val-prompts`` validation rows, one response each sampled (seeded) from the starting policy, read
   teacher-forced by each updated policy, so only the weights differ. Reported per batch and as the mean paired
   difference over the batches with its 95 % t interval.

Usage::

    python benchmarks/bench_spurious_quadrants.py [--batches 4] [--tau-p 0.1 0.002] [--checkpoint DIR] \
        [--out FILE.md]

``--checkpoint <run>/ckpt/global_step_<n>/actor`` reads a tiny run's weights instead of the warm start (then the
batches are those of steps n+1, n+2, …).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_policy as tp  # noqa: E402

from stapo_verl.diagnostics.paired import paired_difference  # noqa: E402
from stapo_verl.diagnostics.quadrants import QUADRANTS, quadrant_table  # noqa: E402

PAPER_EXCESS = 0.167  # STAPO v1, figure 2b: low-p/low-H over high-p/high-H


def actor_config():
    """verl's FSDP ``ActorConfig`` with the tiny recipe's loss and optimizer settings (for the PG loss)."""
    from verl.workers.config import FSDPActorConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    return FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=tp.TINY["train_batch_size"], use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=672, clip_ratio_low=tp.TINY["clip_ratio_low"],
        clip_ratio_high=tp.TINY["clip_ratio_high"], clip_ratio_c=tp.TINY["clip_ratio_c"], loss_agg_mode="token-mean",
        optim=FSDPOptimizerConfig(lr=tp.TINY["lr"], weight_decay=tp.TINY["weight_decay"],
                                  clip_grad=tp.TINY["clip_grad"]),
        rollout_n=tp.TINY["rollout_n"])


def one_step(model, batch: tp.Batch, advantages: torch.Tensor, pg_mask: torch.Tensor, config):
    """A copy of ``model`` after one optimizer step on the PG loss over ``pg_mask`` (π_old = ``batch.log_prob``).

    Returns:
        ``(updated model, pre-clip gradient norm)``.
    """
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config.optimizer import build_optimizer

    m = copy.deepcopy(model)
    m.train()
    opt = build_optimizer(m.parameters(), config.optim)
    log_prob = tp.response_log_prob(tp.response_logits(m, batch), batch)
    config.global_batch_info.clear()  # one process: agg_loss's token-mean divides by Σ pg_mask
    loss, _ = compute_policy_loss_vanilla(batch.log_prob, log_prob, advantages, pg_mask.float(), "token-mean",
                                          config)
    opt.zero_grad()
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(m.parameters(), config.optim.clip_grad))
    opt.step()
    m.eval()
    return m, grad_norm


def fmt(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals, or an em dash for NaN."""
    return "—" if not math.isfinite(x) else f"{x:.{digits}f}"


def quadrant_markdown(table, label: str, q: float) -> list[str]:
    """The markdown lines of one :class:`QuadrantTable`."""
    lines = [f"**{label}** — τ_p = {table.tau_p:g}, q = {q:g}, τ_h per batch = "
             + ", ".join(fmt(t) for t in table.tau_h) + f"; {table.n_positive} positive-advantage tokens", "",
             "| quadrant (p, H) | tokens | mean p | mean H | mean ‖∇_a‖ exact | mean lower bound "
             "| mean upper bound | mean \\|Â\\|·‖∇_a‖ |", "|---|---|---|---|---|---|---|---|"]
    for key in QUADRANTS:
        s = table.quadrants[key]
        lines.append(f"| {key[0]} p, {key[1]} H | {s.count} | {fmt(s.p_mean, 4)} | {fmt(s.entropy_mean)} | "
                     f"{fmt(s.norm_mean)} | {fmt(s.lower_mean)} | {fmt(s.upper_mean)} | {fmt(s.weighted_norm_mean)} |")
    ex = table.excess()
    lines += ["", f"Excess of low-p/low-H over high-p/high-H (mean exact norm): "
              f"{'—' if not math.isfinite(ex) else f'{ex:+.1%}'} (paper, v1 figure 2b: {PAPER_EXCESS:+.1%})", ""]
    return lines



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", type=Path, default=Path(os.environ.get("STAPO_ASSETS") or
                                                        Path.home() / ".cache" / "stapo_verl" / "tiny"))
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="a tiny run's actor checkpoint dir (<run>/ckpt/global_step_<n>/actor); default: warm start")
    ap.add_argument("--batches", type=int, default=4, help="training batches (steps first_step, first_step+1, …)")
    ap.add_argument("--first-step", type=int, default=None, help="default: 1, or n+1 for a global_step_<n> checkpoint")
    ap.add_argument("--data-seed", type=int, default=tp.TINY["data_seed"])
    ap.add_argument("--rollout-seed", type=int, default=tp.TINY["rollout_seed"])
    ap.add_argument("--tau-p", type=float, nargs="+", default=[tp.TINY["tau_p"], 0.002],
                    help="τ_p values (a table each; the first one is the entropy claim's mask); default: the tiny "
                         "recipe's 0.1 and the paper's 0.002")
    ap.add_argument("--q", type=float, default=tp.TINY["entropy_quantile"])
    ap.add_argument("--val-prompts", type=int, default=128, help="held-out validation prompts for the entropy")
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    a = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("STAPO_TORCH_THREADS", "1")))
    t0 = time.time()

    policy = tp.load_policy(a.assets, a.checkpoint)
    first = a.first_step
    if first is None:
        first = 1 if a.checkpoint is None else int(a.checkpoint.resolve().parent.name.rsplit("_", 1)[-1]) + 1
    rows = tp.read_rows(policy.manifest["train_file"])
    batches = []
    for step in range(first, first + a.batches):
        b = tp.sample_batch(policy, tp.step_rows(rows, data_seed=a.data_seed, step=step,
                                                 batch_size=tp.TINY["train_batch_size"]),
                            n=tp.TINY["rollout_n"], rollout_seed=a.rollout_seed, global_step=step, validate=False)
        tp.add_statistics(policy, b)
        b.advantages = tp.grpo_advantages(b)
        batches.append(b)
        print(f"[quadrants] step {step}: {int(b.response_mask.sum())} response tokens, "
              f"reward {float(b.scores.mean()):+.3f} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    def as_dict(b):
        return {"log_prob": b.log_prob, "entropy": b.entropy, "sum_pi_squared": b.sum_pi_squared,
                "advantages": b.advantages, "response_mask": b.response_mask}

    weights = "the warm start (step 0 of every tiny run)" if a.checkpoint is None else str(a.checkpoint)
    out = [f"Weights: {weights}; batches: steps {first}–{first + a.batches - 1} "
           f"(data.seed={a.data_seed}, rollout.seed={a.rollout_seed}, {tp.TINY['train_batch_size']} prompts × "
           f"n = {tp.TINY['rollout_n']}); |V| = {policy.vocab_size}. Norms at unit weight (per unit of advantage); "
           "the bounds are Theorem 3.1's, square-rooted.", ""]
    tables = {}
    for tau_p in a.tau_p:
        tables[tau_p] = quadrant_table((as_dict(b) for b in batches), tau_p=tau_p, q=a.q, vocab_size=policy.vocab_size)
        out += quadrant_markdown(tables[tau_p], f"τ_p = {tau_p:g}", a.q)

    # --- the entropy claim
    from stapo_verl.algo.s2t import s2t_keep_mask

    val_rows = tp.read_rows(policy.manifest["val_file"])[: a.val_prompts]
    held_out = tp.sample_batch(policy, val_rows, n=1, rollout_seed=a.rollout_seed, global_step=0, validate=True)
    h0 = tp.mean_response_entropy(policy.model, held_out)
    config = actor_config()
    tau_p = a.tau_p[0]
    per_batch = []
    for step, b in zip(range(first, first + a.batches), batches):
        keep, stats = s2t_keep_mask(b.log_prob, b.entropy, b.advantages, b.response_mask, tau_p=tau_p, q=a.q)
        silenced = b.response_mask & ~keep
        row = {"step": step, "silenced": int(silenced.sum()), "valid": int(b.response_mask.sum())}
        for arm, mask in (("with", b.response_mask), ("without", keep)):
            m, gnorm = one_step(policy.model, b, b.advantages, mask, config)
            row[f"dH_{arm}"] = tp.mean_response_entropy(m, held_out) - h0
            row[f"dH_train_{arm}"] = tp.mean_response_entropy(m, b) - float(b.entropy[b.response_mask].double().mean())
            with torch.no_grad():
                lp = tp.response_log_prob(tp.response_logits(m, b), b)
            row[f"dlogp_silenced_{arm}"] = float((lp - b.log_prob)[silenced].double().mean()) if row["silenced"] \
                else math.nan
            row[f"grad_norm_{arm}"] = gnorm
        per_batch.append(row)
        print(f"[quadrants] entropy claim, step {step}: ΔH with {row['dH_with']:+.5f}, without "
              f"{row['dH_without']:+.5f} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    def d(key):
        return paired_difference([r[f"{key}_without"] for r in per_batch], [r[f"{key}_with"] for r in per_batch])

    out += [f"**Entropy claim** — one optimizer step from the same weights on the same batch, with every token vs "
            f"without the S2T-silenced ones (τ_p = {tau_p:g}, q = {a.q}); held-out: mean entropy over the responses "
            f"of {len(val_rows)} validation prompts (one seeded sample each from the starting policy, "
            f"{int(held_out.response_mask.sum())} tokens, teacher-forced), H₀ = {h0:.5f} nats.", "",
            "| batch (step) | silenced / valid tokens | ΔH held-out, with | ΔH held-out, without "
            "| with − without | ΔH own batch, with − without | Δ log p of silenced tokens, with / without "
            "| grad norm with / without |",
            "|---|---|---|---|---|---|---|---|"]
    for r in per_batch:
        out.append(f"| {r['step']} | {r['silenced']} / {r['valid']} | {r['dH_with']:+.5f} | {r['dH_without']:+.5f} | "
                   f"{r['dH_with'] - r['dH_without']:+.5f} | {r['dH_train_with'] - r['dH_train_without']:+.5f} | "
                   f"{fmt(r['dlogp_silenced_with'])} / {fmt(r['dlogp_silenced_without'])} | "
                   f"{r['grad_norm_with']:.3f} / {r['grad_norm_without']:.3f} |")
    out += ["", f"Mean over the {len(per_batch)} batches, with − without (95 % paired t interval): held-out ΔH "
            f"{d('dH').format(5)} nats; own batch ΔH {d('dH_train').format(5)} nats.",
            "", f"({time.time() - t0:.0f} s)"]
    text = "\n".join(out)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
