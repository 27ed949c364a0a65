"""Benchmark: a paired multi-seed comparison of the vanilla loss, STAPO (``s2t``) and 20-Entropy (``top_entropy``)
on the tiny CPU task, with 95 % paired confidence intervals.

One command runs every (seed, arm) pair with the real trainer (``bash recipes/run.sh tiny <method>``, one run at a
time, each in ``OUT/seed<s>/<arm>``), reads each run's ``metrics.jsonl``, evaluates each run's last checkpoint
in process, and writes ``OUT/comparison.md`` (the table), ``OUT/comparison.json`` (every per-run value) and three
figures (``entropy.png``, ``lm_head_grad_norm.png``, ``val_accuracy.png``). A finished run is not run again, so an
interrupted comparison continues with the same command.

Arms (all: GRPO advantages, the tiny recipe's data, batch, lr, clip-higher 0.2 / 0.28, dual clip 10, token-mean):

=============  ==========================================================================================
``vanilla``    verl's vanilla loss without masking (the settings of ``run.sh tiny justrl``), selected as
               ``run.sh tiny top_entropy`` with ``TOP_ENTROPY_RATIO=1``: a mask that keeps every valid token,
               so the PG term is exactly the vanilla token-mean, and the plugin reads the LM-head gradient
               norm (it does so only in runs with a token mask)
``stapo``      ``run.sh tiny stapo``: vanilla + the S2T mask (τ_p = 0.1, q = 0.75: the tiny recipe's)
``top_entropy``  ``run.sh tiny top_entropy``: vanilla + the 20-Entropy mask (ρ = 0.2)
``grpo``       optional: ``run.sh tiny grpo`` (DeepSeekMath GRPO: + KL loss against a reference model,
               symmetric clip 0.2, seq-mean-token-mean) with the same keep-all mask; it differs from
               ``stapo`` in four settings besides the mask, so its contrast does not isolate the mask
``justrl``     optional: ``run.sh tiny justrl``, the vanilla loss with no token mask at all (the plugin then
               reads no LM-head norm); the check that ``vanilla``'s keep-all mask changes nothing
=============  ==========================================================================================

Seeds. Seed s sets every seed a tiny run reads, equal across arms: ``data.seed`` (the data loader's shuffle),
``actor_rollout_ref.rollout.seed`` (per-request rollout seeds under ``rollout.full_determinism=True``, training and
validation), ``actor_rollout_ref.actor.fsdp_config.seed`` and ``actor_rollout_ref.ref.fsdp_config.seed`` (the
engines' ``enable_full_determinism``), ``actor_rollout_ref.actor.data_loader_seed`` (mini-batch shuffling). The arms
of one seed therefore share every random draw until their weights differ: the step-1 rollout is identical (checked
and reported).

Length: 20 steps (``--steps``), the tiny recipe's own. The default STAPO run's ``actor/entropy`` falls from 0.64–0.69
nats at step 1 to 0.23 at step 10 and 0.13–0.14 at step 20, a fifth of its start (README, ``docs/diagnostics.md``);
a 117-step run of the same command went on to 0.11 at step 30, 0.09 at 50 and 0.06 at 100: most of the fall happens
in the first 20 steps, and 15 runs of 20 steps fit the 90-minute budget on 2 cores where 30 would not.

Per run: validation accuracy (640 rows, n = 1, T = 1) at the last step (and at step 10); ``actor/entropy`` at every
step; collapse early-warnings (the plugin's :class:`stapo_verl.diagnostics.collapse.CollapseMonitor` at its defaults,
window 20, warm-up 5, |z| > 4, re-run over the run's metrics so every arm is scored alike); LM-head gradient-norm
spikes (steps whose ``actor/stapo/lm_head_grad_norm`` is more than ``--spike-z`` running sd above its running mean,
same window) and its peak / median; the rate of sampled tokens with p < 1e-4 (``--garbage-prompts`` validation
prompts, one seeded sample each at T = 1 from the last checkpoint, p from the sampler's own distribution).

Usage::

    python benchmarks/paired_comparison.py --seeds 5                 # the comparison (about 85 min on 2 idle cores)
    python benchmarks/paired_comparison.py --dry                     # print the commands only
    python benchmarks/paired_comparison.py --smoke                   # 1 seed × 3 arms × 2 steps, small validation
    python benchmarks/paired_comparison.py --seeds 5 -- trainer.logger=[console,file]   # extra Hydra overrides
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: validation accuracy key of the tiny run (one data source)
VAL_KEY = "val-core/math_dapo/acc/mean@1"
ENTROPY_KEY = "actor/entropy"
LM_HEAD_KEY = "actor/stapo/lm_head_grad_norm"
#: p below which a sampled token counts as "garbage" (the stray tokens of the tiny run's tables)
GARBAGE_P = 1e-4
#: the collapse monitor's defaults (policy_loss.collapse_window / collapse_warmup_steps / collapse_z_threshold)
COLLAPSE_WINDOW, COLLAPSE_WARMUP, COLLAPSE_Z = 20, 5, 4.0
#: the steps at which the entropy trajectory is tabulated (those ≤ the run's length)
ENTROPY_STEPS = (1, 5, 10, 15, 20, 30, 40)


@dataclass(frozen=True)
class Arm:
    """One arm: the recipe method, its environment and its extra overrides."""

    name: str
    method: str
    env: dict = field(default_factory=dict)
    overrides: tuple = ()
    about: str = ""


KEEP_ALL = ("++actor_rollout_ref.actor.policy_loss.token_mask=top_entropy",
            "++actor_rollout_ref.actor.policy_loss.top_entropy_ratio=1.0")
ARMS = {
    "vanilla": Arm("vanilla", "top_entropy", {"TOP_ENTROPY_RATIO": "1.0"},
                   about="verl's vanilla loss, no masking (keep-all mask)"),
    "stapo": Arm("stapo", "stapo", about="vanilla + S2T (τ_p 0.1, q 0.75)"),
    "top_entropy": Arm("top_entropy", "top_entropy", {"TOP_ENTROPY_RATIO": "0.2"},
                       about="vanilla + 20-Entropy (ρ 0.2)"),
    "grpo": Arm("grpo", "grpo", overrides=KEEP_ALL, about="DeepSeekMath GRPO (KL + ref, seq-mean-token-mean)"),
    "justrl": Arm("justrl", "justrl", about="verl's vanilla loss, no token mask at all (no LM-head norm)"),
}


def seed_overrides(seed: int) -> list[str]:
    """Every seed key of a tiny run, set to ``seed`` (equal across the arms of one seed)."""
    return [f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}",
            f"actor_rollout_ref.actor.fsdp_config.seed={seed}", f"actor_rollout_ref.ref.fsdp_config.seed={seed}",
            f"actor_rollout_ref.actor.data_loader_seed={seed}"]


def run_command(arm: Arm, seed: int, run_dir: Path, *, steps: int, test_freq: int, val_before_train: bool,
                val_max_samples: int | None, extra: list[str]) -> tuple[dict, list[str]]:
    """``(environment additions, argv)`` of one run: ``bash recipes/run.sh tiny <method> <overrides>``.

    The run validates every ``test_freq`` steps and at the last, saves one checkpoint at the last step (the
    post-run evaluation reads it), and writes into ``run_dir`` (``STAPO_RUN_DIR``).
    """
    env = {"STAPO_RUN_DIR": str(run_dir), **arm.env}
    overrides = [*seed_overrides(seed), f"trainer.total_training_steps={steps}", f"trainer.test_freq={test_freq}",
                 f"trainer.save_freq={steps}", f"trainer.val_before_train={val_before_train}", *arm.overrides]
    if val_max_samples is not None:
        overrides.append(f"data.val_max_samples={val_max_samples}")
    return env, ["bash", str(REPO / "recipes" / "run.sh"), "tiny", arm.method, *overrides, *extra]


def read_metrics(path: Path) -> dict[int, dict]:
    """``{step: metrics}`` of verl's ``file`` logger output (lines ``{"step": s, "data": {...}}``), lines of one
    step merged (later values win)."""
    out: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out.setdefault(int(row["step"]), {}).update(row.get("data", {}))
    return out


def collapse_events(values: list[float], *, window: int = COLLAPSE_WINDOW, warmup: int = COLLAPSE_WARMUP,
                    threshold: float = COLLAPSE_Z, upward_only: bool = False) -> list[int]:
    """Indices (0-based) of the values whose running z-score exceeds ``threshold`` (``|z|``; ``z`` with
    ``upward_only``), scored as the plugin's collapse monitor scores them
    (:class:`stapo_verl.diagnostics.collapse.RunningZScore`)."""
    from stapo_verl.diagnostics.collapse import RunningZScore

    score = RunningZScore(window, warmup)
    hits = []
    for i, v in enumerate(values):
        z, *_ = score.update(float(v))
        if z is not None and (z > threshold if upward_only else abs(z) > threshold):
            hits.append(i)
    return hits


def summarize_run(metrics: dict[int, dict], steps: int, spike_z: float) -> dict:
    """The per-run values of the comparison from ``{step: metrics}`` (see the module docstring).

    Returns:
        dict with ``val_acc_final``, ``val_acc_10`` (NaN when absent), ``entropy`` ({step: value}),
        ``entropy_first``, ``entropy_last``, ``entropy_last_over_first``, ``collapse_warnings`` (entropy and LM-head
        warnings, or the total grad norm's where the LM-head norm is missing, as the monitor warns),
        ``lm_head_spikes``, ``lm_head_peak_over_median``, ``step1`` (the step-1 rollout's reward, response length and
        entropy, for the pairing check), ``steps_done``.
    """
    train_steps = sorted(s for s, m in metrics.items() if ENTROPY_KEY in m)
    ent = {s: float(metrics[s][ENTROPY_KEY]) for s in train_steps}
    lm = [float(metrics[s][LM_HEAD_KEY]) for s in train_steps if LM_HEAD_KEY in metrics[s]]
    grad = [float(metrics[s]["actor/grad_norm"]) for s in train_steps if "actor/grad_norm" in metrics[s]]
    warnings = len(collapse_events(list(ent.values())))
    warnings += len(collapse_events(lm)) if lm else len(collapse_events(grad))
    nan = math.nan
    first, last = (ent[train_steps[0]], ent[train_steps[-1]]) if train_steps else (nan, nan)
    s1 = metrics.get(1, {})
    return {
        "steps_done": train_steps[-1] if train_steps else 0,
        "val_acc_final": float(metrics.get(steps, {}).get(VAL_KEY, nan)),
        "val_acc_10": float(metrics.get(10, {}).get(VAL_KEY, nan)),
        "val_acc_0": float(metrics.get(0, {}).get(VAL_KEY, nan)),
        "entropy": ent,
        "entropy_first": first,
        "entropy_last": last,
        "entropy_last_over_first": last / first if first and math.isfinite(first) else nan,
        "collapse_warnings": warnings,
        "lm_head_spikes": len(collapse_events(lm, threshold=spike_z, upward_only=True)) if lm else nan,
        "lm_head_peak_over_median": max(lm) / statistics.median(lm) if lm else nan,
        "lm_head": lm,
        "step1": [s1.get("critic/score/mean"), s1.get("response_length/mean"), s1.get(ENTROPY_KEY)],
    }


def garbage_rate(run_dir: Path | None, assets: Path, *, seed: int, step: int, prompts: int) -> dict:
    """Rate of sampled tokens with p < :data:`GARBAGE_P`: ``prompts`` validation prompts, one sample each at T = 1
    (request seeds of ``rollout.seed = seed``, validation, ``global_step = step``) from the checkpoint of ``step``
    in ``run_dir`` (None: the warm start); p is the sampled token's probability under the sampling policy.

    Returns:
        ``{"rate", "tokens", "garbage", "mean_entropy"}``.
    """
    import torch

    import tiny_policy as tp

    ckpt = None if run_dir is None else run_dir / "ckpt" / f"global_step_{step}" / "actor"
    policy = tp.load_policy(assets, ckpt)
    rows = tp.read_rows(policy.manifest["val_file"])[:prompts]
    batch = tp.add_statistics(policy, tp.sample_batch(policy, rows, n=1, rollout_seed=seed, global_step=step,
                                                      validate=True))
    m = batch.response_mask
    garbage = int((batch.log_prob[m] < math.log(GARBAGE_P)).sum())
    tokens = int(m.sum())
    return {"rate": garbage / max(tokens, 1), "tokens": tokens, "garbage": garbage,
            "mean_entropy": float(batch.entropy[m].double().mean()), "threads": torch.get_num_threads()}


def run_done(run_dir: Path, steps: int) -> bool:
    """True when ``run_dir`` holds a finished run of ``steps`` steps (exit 0, the last step in its metrics)."""
    wall, metrics = run_dir / "wall.json", run_dir / "metrics.jsonl"
    if not (wall.exists() and metrics.exists()):
        return False
    if json.loads(wall.read_text()).get("returncode") != 0:
        return False
    return max(read_metrics(metrics), default=-1) >= steps


def run_logged(cmd: list[str], env: dict, run_dir: Path) -> int:
    """Run one recipe command from the repository root with ``env`` added to this process's environment, its output
    appended to ``<run_dir parent>/<run_dir name>.console.log``; returns its exit status. Raises nothing."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.console.log", "a") as log:
        return subprocess.call(cmd, env={**os.environ, **env}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def comparison_table(results: dict, arms: list[str], seeds: list[int], steps: int, step0_garbage: dict) -> str:
    """The markdown of the comparison: per-arm means over seeds and paired differences against the first arm."""
    from stapo_verl.diagnostics.paired import mean_interval, paired_difference

    base = arms[0]

    def vals(arm, key, sub=None):
        out = []
        for s in seeds:
            r = results.get(f"{s}/{arm}")
            v = math.nan if r is None else (r[key] if sub is None else r[key].get(sub, math.nan))
            out.append(float(v) if v is not None else math.nan)
        return out

    rows = [("validation accuracy, last step", "val_acc_final", None, 3),
            ("validation accuracy, step 10", "val_acc_10", None, 3)]
    rows += [(f"entropy (nats), step {st}", "entropy", st, 4) for st in ENTROPY_STEPS if st <= steps]
    rows += [("entropy last / first step", "entropy_last_over_first", None, 3),
             ("collapse warnings (count)", "collapse_warnings", None, 2),
             ("LM-head grad-norm spikes (count)", "lm_head_spikes", None, 2),
             ("LM-head grad-norm peak / median", "lm_head_peak_over_median", None, 2),
             (f"sampled tokens with p < {GARBAGE_P:g}, last checkpoint (rate)", "garbage_rate", None, 5)]
    head = "| metric | " + " | ".join(f"{a} (mean ± 95 % CI)" for a in arms) + " | " + \
        " | ".join(f"{a} − {base} (paired 95 % CI)" for a in arms[1:]) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(arms) - 1)]
    for label, key, sub, digits in rows:
        cells = [mean_interval(vals(a, key, sub)).format(digits).lstrip("+") for a in arms]
        diffs = [paired_difference(vals(base, key, sub), vals(a, key, sub)).format(digits) for a in arms[1:]]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(diffs) + " |")
    if step0_garbage:
        g0 = [step0_garbage[s]["rate"] for s in seeds if s in step0_garbage]
        lines += ["", f"Sampled tokens with p < {GARBAGE_P:g} at the warm start (same prompts and seeds): "
                  f"{mean_interval(g0).format(5).lstrip('+')}."]
    return "\n".join(lines)


def figures(results: dict, arms: list[str], seeds: list[int], out: Path) -> list[Path]:
    """``entropy.png``, ``lm_head_grad_norm.png`` (per seed thin, mean thick) and ``val_accuracy.png`` (one line per
    seed across the arms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {a: c for a, c in zip(arms, ("tab:gray", "tab:blue", "tab:orange", "tab:green"))}
    written = []
    for name, getter, ylabel in (("entropy", lambda r: (list(r["entropy"]), list(r["entropy"].values())), "nats"),
                                 ("lm_head_grad_norm", lambda r: (list(range(1, len(r["lm_head"]) + 1)),
                                                                  r["lm_head"]), "pre-clip L2 norm")):
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for a in arms:
            curves = [getter(results[f"{s}/{a}"]) for s in seeds if f"{s}/{a}" in results]
            curves = [c for c in curves if c[0]]
            for x, y in curves:
                ax.plot(x, y, color=colors[a], alpha=0.25, lw=0.8)
            if curves:
                n = min(len(c[0]) for c in curves)
                ax.plot(curves[0][0][:n], [statistics.fmean(c[1][i] for c in curves) for i in range(n)],
                        color=colors[a], lw=2, label=f"{a} (mean of {len(curves)})")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{'actor/entropy' if name == 'entropy' else LM_HEAD_KEY}, paired seeds")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
        written.append(out / f"{name}.png")
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for s in seeds:
        ys = [results.get(f"{s}/{a}", {}).get("val_acc_final", math.nan) for a in arms]
        ax.plot(range(len(arms)), ys, marker="o", color="tab:gray", alpha=0.6)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel(VAL_KEY)
    ax.set_title("validation accuracy at the last step, one line per seed")
    fig.tight_layout()
    fig.savefig(out / "val_accuracy.png", dpi=120)
    plt.close(fig)
    return written + [out / "val_accuracy.png"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (first-seed, first-seed+1, …)")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--test-freq", type=int, default=10)
    ap.add_argument("--arms", default="vanilla,stapo,top_entropy",
                    help=f"comma-separated, the first is the baseline of the differences; known: {sorted(ARMS)}")
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "paired_comparison")
    ap.add_argument("--val-max-samples", type=int, default=None, help="data.val_max_samples (default: all 640)")
    ap.add_argument("--garbage-prompts", type=int, default=256, help="validation prompts of the p < 1e-4 rate")
    ap.add_argument("--spike-z", type=float, default=3.0, help="z above which an LM-head grad norm is a spike")
    ap.add_argument("--assets", type=Path, default=Path(os.environ.get("STAPO_ASSETS") or
                                                        Path.home() / ".cache" / "stapo_verl" / "tiny"))
    ap.add_argument("--dry", action="store_true", help="print the commands and exit")
    ap.add_argument("--smoke", action="store_true",
                    help="1 seed, 2 steps, 32 validation rows, 16 prompts for the p < 1e-4 rate (plumbing only)")
    a = ap.parse_args(argv)
    if a.smoke:
        a.seeds, a.steps, a.test_freq, a.val_max_samples, a.garbage_prompts = 1, 2, 2, 32, 16
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    unknown = [x for x in arms if x not in ARMS]
    if unknown or len(arms) < 2:
        ap.error(f"--arms needs at least two of {sorted(ARMS)}; unknown: {unknown}")
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    out = a.out.resolve()
    plan = []
    for s in seeds:
        for i, name in enumerate(arms):
            run_dir = out / f"seed{s}" / name
            # step-0 validation: the same weights and seeds in every arm of a seed, so only the first arm runs it
            env, cmd = run_command(ARMS[name], s, run_dir, steps=a.steps, test_freq=a.test_freq,
                                   val_before_train=(i == 0), val_max_samples=a.val_max_samples, extra=extra)
            plan.append((s, name, run_dir, env, cmd))
    if a.dry:
        for s, name, run_dir, env, cmd in plan:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(cmd))
        return 0

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for k, (s, name, run_dir, env, cmd) in enumerate(plan, 1):
        if run_done(run_dir, a.steps):
            print(f"[paired] {k}/{len(plan)} seed {s} {name}: done before, kept", flush=True)
            continue
        print(f"[paired] {k}/{len(plan)} seed {s} {name} ({time.time() - t0:.0f} s so far)", flush=True)
        rc = run_logged(cmd, env, run_dir)
        if rc != 0:
            print(f"[paired] seed {s} {name} failed (exit {rc}); see {run_dir}/train.log", flush=True)

    import torch

    torch.set_num_threads(1)
    results, step0_garbage = {}, {}
    for s, name, run_dir, _, _ in plan:
        if not run_done(run_dir, a.steps):
            continue
        r = summarize_run(read_metrics(run_dir / "metrics.jsonl"), a.steps, a.spike_z)
        cache = run_dir / "garbage_rate.json"
        if not cache.exists():
            cache.write_text(json.dumps(garbage_rate(run_dir, a.assets, seed=s, step=a.steps,
                                                     prompts=a.garbage_prompts)))
        g = json.loads(cache.read_text())
        r["garbage_rate"], r["garbage_tokens"] = g["rate"], g["tokens"]
        results[f"{s}/{name}"] = r
    for s in seeds:
        cache = out / f"seed{s}" / "garbage_rate_step0.json"
        if any(f"{s}/{x}" in results for x in arms):
            if not cache.exists():
                cache.write_text(json.dumps(garbage_rate(None, a.assets, seed=s, step=a.steps,
                                                         prompts=a.garbage_prompts)))
            step0_garbage[s] = json.loads(cache.read_text())
        base0 = results.get(f"{s}/{arms[0]}", {}).get("val_acc_0", math.nan)
        for x in arms[1:]:
            if f"{s}/{x}" in results:
                results[f"{s}/{x}"]["val_acc_0"] = base0  # same weights and seeds: run once per seed

    pairing = {}
    for s in seeds:
        step1 = [json.dumps(results[f"{s}/{x}"]["step1"]) for x in arms if f"{s}/{x}" in results]
        pairing[s] = None if len(step1) < 2 else len(set(step1)) == 1
    table = comparison_table(results, arms, seeds, a.steps, step0_garbage)
    text = "\n".join([
        f"# Paired comparison on the tiny task: {', '.join(arms)}", "",
        f"{len(seeds)} seeds ({seeds[0]}–{seeds[-1]}), {a.steps} steps, validation every {a.test_freq} steps"
        f"{'' if a.val_max_samples is None else f' on {a.val_max_samples} rows'}; runs finished: {len(results)} of "
        f"{len(plan)}. Arms: " + "; ".join(f"`{x}` = {ARMS[x].about}" for x in arms) + ".", "",
        "Pairing check (the step-1 rollout's reward, response length and entropy are identical across the arms of a "
        "seed): " + ", ".join(f"seed {s}: {'n/a' if ok is None else 'yes' if ok else 'NO'}"
                                for s, ok in pairing.items()) + ".", "",
        table, "",
        f"Intervals: Student t over seeds (mean ± t·sd/√n); paired differences use the same seed's runs. Collapse "
        f"warnings: the plugin's monitor (window {COLLAPSE_WINDOW}, warm-up {COLLAPSE_WARMUP}, |z| > {COLLAPSE_Z:g}) "
        f"on actor/entropy and the LM-head norm; spikes: LM-head norm z > {a.spike_z:g}.",
        "", f"Command: `python benchmarks/paired_comparison.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
    ])
    (out / "comparison.md").write_text(text + "\n")
    (out / "comparison.json").write_text(json.dumps({"arms": arms, "seeds": seeds, "steps": a.steps,
                                                     "results": results, "step0_garbage": step0_garbage,
                                                     "pairing": pairing}, indent=1, default=str))
    figs = figures(results, arms, seeds, out) if results else []
    print(text)
    print(f"[paired] wrote {out / 'comparison.md'}, comparison.json, " + ", ".join(p.name for p in figs)
          + f" ({time.time() - t0:.0f} s)")
    return 0 if len(results) == len(plan) else 1


if __name__ == "__main__":
    sys.exit(main())
