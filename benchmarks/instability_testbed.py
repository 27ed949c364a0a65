"""Benchmark: a small-scale instability testbed for STAPO's central claim, defined before it is looked for.

The paper (arXiv 2602.15620, §1 and §5) says GRPO-style training degrades late (entropy rebounds, accuracy falls) and
that silencing the rare spurious tokens (positive advantage, low probability, low entropy) prevents it. On the tiny
CPU task at the tiny recipe's settings (20 steps, lr 2e-4) nothing goes wrong (``benchmarks/paired_comparison.py``:
STAPO − vanilla +0.001 [−0.014, +0.016]). This benchmark first searches, with vanilla GRPO only, for a setting in which
training fails by the criterion below, then compares the arms in it.

Pre-registration (fixed in this docstring before any STAPO arm runs in a searched setting; the commit that adds
this file is the record; changing it afterwards needs a new commit that says why)
====================================================================================================================

**Failure of a run** (:func:`instability`): any of the three, each judged only after the first
:data:`WARMUP_STEPS` = 10 steps (the tiny run sharpens fast in its first ~10 steps: entropy falls to about a third,
accuracy rises by 15-20 points; that is learning, not failure):

1. *accuracy collapse*: at two consecutive validation points after step 10 (validation every 10 steps on all 640
   rows, one sample each at T = 1: standard error <= 2.0 points), ``val-core/math_dapo/acc/mean@1`` is at least
   :data:`ACC_DROP` = 0.05 below its running best (over every earlier validation point, step 0 included);
2. *entropy rebound*: ``actor/entropy`` is at least :data:`ENTROPY_RISE` = 1.5 times its running minimum (over every
   earlier step) for :data:`ENTROPY_RUN` = 3 consecutive steps;
3. *gradient blow-up*: ``actor/stapo/lm_head_grad_norm`` (the LM head's gradient norm before clipping; every arm runs
   with a token mask so the plugin records it, vanilla with the keep-all mask) exceeds :data:`GRAD_FACTOR` = 5 times
   the median of its previous :data:`GRAD_WINDOW` = 10 steps.

**Onset**: the first step at which a criterion is met (1: the first of the two validation points; 2: the first of
the three steps; 3: that step). A run that fails by several criteria reports the earliest onset and every criterion.

**Search** (``--search``): vanilla only, 2 seeds per candidate (:data:`CANDIDATES`, the knobs a verl user turns:
learning rate, steps, clip-higher, temperature, group size), every candidate's numbers kept. A candidate *qualifies*
when both seeds fail; a qualifying candidate is then run with 5 vanilla seeds, and it is the testbed if at least 3 of
the 5 fail. If none qualifies, the search is the result.

**Primary comparison** in the testbed, paired over >= 5 seeds (the seeds of an arm pair share every random draw until
their weights differ): STAPO (``s2t`` at the paper's τ_p = 0.002, and at the tiny recipe's 0.1) against vanilla (the
paper's GRPO: verl's vanilla loss, token-mean, clip-higher): (a) the number of failed seeds per arm, with the
discordant pairs (vanilla failed and STAPO not, and the reverse) and the exact two-sided sign test on them; (b)
validation accuracy at the last step, the paired mean difference with its 95 % t interval.

**Secondary**: the same against the paper's ablations with the same silenced count (``s2t_random``,
``s2t_high_entropy``) and 20-Entropy (``top_entropy``); per arm: onset step; best and last validation accuracy;
entropy curves; LM-head gradient norm (peak over median); the collapse early-warnings the plugin fired
(``actor/stapo/collapse/*``) and how many came before the onset (the warning's lead time in steps); the rate of
sampled tokens with p < 1e-4 at the last checkpoint; the silenced share of the gradient per step.

Usage::

    python benchmarks/instability_testbed.py --search                   # every candidate, vanilla, seeds 1-2
    python benchmarks/instability_testbed.py --search --only lr6e-4     # one candidate
    python benchmarks/instability_testbed.py --search --dry             # the commands only
    python benchmarks/instability_testbed.py --confirm lr4e-4           # a qualifying candidate, vanilla, seeds 1-5

Runs go to ``OUT/<candidate>/seed<s>/vanilla`` (default ``outputs/instability``); a finished run is not run again, so
an interrupted search continues with the same command. A finished comparison run is also kept in the repository,
``benchmarks/results/instability/<candidate>/<arm>_seed<s>.json`` (the metrics the tables read, a digest of all of
them, the CPU type), because ``outputs/`` does not outlive a clone: ``--compare`` reuses a kept run made on the same
CPU type (a run is reproducible on one CPU type, not across types) instead of running it again. ``--rerun ARM:SEED``
runs a kept run again and prints how many of its values differ. ``OUT/search.md`` and ``OUT/search.json`` hold the table;
``--confirm`` reuses the search's seeds 1-2 and writes ``OUT/confirm_<candidate>.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paired_comparison as pc  # noqa: E402  (a sibling script: its runner, run layout and metrics reader)

REPO = pc.REPO
VAL_KEY, ENTROPY_KEY, LM_HEAD_KEY = pc.VAL_KEY, pc.ENTROPY_KEY, pc.LM_HEAD_KEY
#: steps before any criterion is judged
WARMUP_STEPS = 10
#: accuracy collapse: drop below the running best, on this many consecutive validation points
ACC_DROP, ACC_RUN = 0.05, 2
#: entropy rebound: ratio to the running minimum, on this many consecutive steps
ENTROPY_RISE, ENTROPY_RUN = 1.5, 3
#: gradient blow-up: ratio to the median of the previous GRAD_WINDOW steps
GRAD_FACTOR, GRAD_WINDOW = 5.0, 10
#: validation every this many steps (and before training)
TEST_FREQ = 10
#: seeds per candidate in the search
SEARCH_SEEDS = 2
#: the plugin's collapse z-scores (``actor/stapo/collapse/*``); a console warning fires at |z| > the threshold
#: (``policy_loss.collapse_z_threshold``, default 4)
COLLAPSE_Z_KEYS = ("actor/stapo/collapse/entropy_z", "actor/stapo/collapse/grad_norm_z",
                   "actor/stapo/collapse/lm_head_grad_norm_z")
COLLAPSE_Z_THRESHOLD = 4.0
#: the silenced share of the policy gradient per step (S2T-family masks; ``docs/diagnostics.md``)
GRAD_SHARE_KEY = "actor/stapo/silenced_grad_share"
#: a qualifying candidate's confirmation: this many vanilla seeds, of which at least CONFIRM_FAILS must fail
CONFIRM_SEEDS, CONFIRM_FAILS = 5, 3
#: finished comparison runs kept in the repository, and the metrics kept of each step (what the tables read)
STORE = REPO / "benchmarks" / "results" / "instability"
STORED_KEYS = (VAL_KEY, ENTROPY_KEY, LM_HEAD_KEY, *COLLAPSE_Z_KEYS, GRAD_SHARE_KEY)
#: the CPU features the kernels (and so a seeded run) depend on
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Verdict:
    """What :func:`instability` found in one run.

    Attributes:
        failed: a criterion was met.
        onset: the earliest onset step (None when not failed).
        criteria: ``{criterion: onset step}`` for each criterion met (``accuracy``, ``entropy``, ``grad``).
    """

    failed: bool
    onset: int | None
    criteria: dict = field(default_factory=dict)


def _accuracy_onset(val: dict[int, float]) -> int | None:
    best, run = -1.0, []
    for step in sorted(val):
        if step > WARMUP_STEPS and best >= 0 and val[step] <= best - ACC_DROP:
            run.append(step)
            if len(run) == ACC_RUN:
                return run[0]
        else:
            run = []
        best = max(best, val[step])
    return None


def _entropy_onset(ent: dict[int, float]) -> int | None:
    low, run = float("inf"), []
    for step in sorted(ent):
        if step > WARMUP_STEPS and ent[step] >= ENTROPY_RISE * low:
            run.append(step)
            if len(run) == ENTROPY_RUN:
                return run[0]
        else:
            run = []
        low = min(low, ent[step])
    return None


def _grad_onset(grad: dict[int, float]) -> int | None:
    steps = sorted(grad)
    for i, step in enumerate(steps):
        if step > WARMUP_STEPS and i >= GRAD_WINDOW:
            if grad[step] > GRAD_FACTOR * statistics.median(grad[s] for s in steps[i - GRAD_WINDOW:i]):
                return step
    return None


def instability(metrics: dict[int, dict]) -> Verdict:
    """The pre-registered failure criterion (module docstring) applied to one run.

    Args:
        metrics: ``{step: {key: value}}`` as :func:`paired_comparison.read_metrics` reads verl's ``file`` logger
            (validation at step 0 is a row of its own). Steps without a key are skipped for that criterion.

    Returns:
        a :class:`Verdict`. Raises nothing.
    """
    series = {key: {s: float(m[key]) for s, m in metrics.items() if key in m}
              for key in (VAL_KEY, ENTROPY_KEY, LM_HEAD_KEY)}
    onsets = {"accuracy": _accuracy_onset(series[VAL_KEY]), "entropy": _entropy_onset(series[ENTROPY_KEY]),
              "grad": _grad_onset(series[LM_HEAD_KEY])}
    met = {k: v for k, v in onsets.items() if v is not None}
    return Verdict(bool(met), min(met.values()) if met else None, met)


@dataclass(frozen=True)
class Candidate:
    """A setting of the search: the vanilla arm of the tiny recipe with these Hydra overrides, for ``steps`` steps."""

    name: str
    steps: int
    overrides: tuple = ()
    about: str = ""


A = "actor_rollout_ref"
#: cheapest and most likely first (the tiny recipe: lr 2e-4, clip 0.2 / 0.28, T = 1, n = 8, 20 steps; at 1e-3 it
#: collapsed within 5 steps, an early failure, not the late one the paper describes)
CANDIDATES = (
    Candidate("lr4e-4", 100, (f"{A}.actor.optim.lr=4e-4",), "lr 4e-4 (one of two earlier 20-step seeds fell below start)"),
    Candidate("lr6e-4", 100, (f"{A}.actor.optim.lr=6e-4",), "lr 6e-4"),
    Candidate("lr4e-4_clip0.4", 100, (f"{A}.actor.optim.lr=4e-4", f"{A}.actor.clip_ratio_high=0.4"),
              "lr 4e-4, clip-higher 0.4"),
    Candidate("lr4e-4_T1.2", 100, (f"{A}.actor.optim.lr=4e-4", f"{A}.rollout.temperature=1.2"),
              "lr 4e-4, rollout temperature 1.2 (validation stays at T = 1)"),
    Candidate("lr4e-4_n4", 100, (f"{A}.actor.optim.lr=4e-4", f"{A}.rollout.n=4"), "lr 4e-4, group size 4"),
    Candidate("lr2e-4_200", 200, (), "the tiny recipe's lr 2e-4, 200 steps"),
)


#: the arms of the comparison (module docstring), vanilla first: the paired comparison's arms, the paper's τ_p and
#: the masking ablations (the same S2T keys as ``stapo``)
TESTBED_ARMS = {
    "vanilla": pc.ARMS["vanilla"],
    "stapo": pc.ARMS["stapo"],
    "stapo_paper_tau": pc.Arm("stapo_paper_tau", "stapo", overrides=(f"{A}.actor.policy_loss.s2t_tau_p=0.002",),
                              about="vanilla + S2T at the paper's τ_p 0.002 (q 0.75)"),
    "s2t_random": pc.Arm("s2t_random", "stapo_random", about="ablation: as many candidates silenced, at random"),
    "s2t_high_entropy": pc.Arm("s2t_high_entropy", "stapo_high_entropy",
                               about="ablation: the high-entropy candidates silenced"),
    "top_entropy": pc.ARMS["top_entropy"],
}


def compare_plan(out: Path, cand: Candidate, arms: list[str], seeds: list[int]) -> list[tuple]:
    """``(arm, seed, run_dir, env, argv)`` of every comparison run in ``cand``'s setting, arm by arm (so a stopped
    comparison has whole arms); vanilla's runs are the search's and the confirmation's (same directories)."""
    plan = []
    for arm in arms:
        for s in seeds:
            run_dir = out / cand.name / f"seed{s}" / arm
            env, argv = pc.run_command(TESTBED_ARMS[arm], s, run_dir, steps=cand.steps, test_freq=TEST_FREQ,
                                       val_before_train=True, val_max_samples=None, extra=list(cand.overrides))
            plan.append((arm, s, run_dir, env, argv))
    return plan


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test: P(a split at least this uneven) of ``wins + losses`` fair coin flips."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def compare_table(rows: dict[str, dict[int, dict]], arms: list[str], seeds: list[int]) -> str:
    """Markdown of the comparison: per arm the failed seeds (with the discordant pairs against vanilla and the exact
    sign test on them), the onsets, and the last validation accuracy with its paired difference to vanilla (95 %
    t interval). ``rows[arm][seed]``: :func:`run_row` of a finished run (missing runs are left out of the pairs)."""
    from stapo_verl.diagnostics.paired import mean_interval, paired_difference

    base = rows.get("vanilla", {})
    lines = ["| arm | seeds run | failed | vanilla failed, arm not / the reverse (sign test p) | onsets | "
             "val acc, last step (mean ± 95 % CI) | − vanilla (paired 95 % CI) | val acc, best |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        got = {s: rows.get(arm, {}).get(s) for s in seeds}
        done = [s for s in seeds if got[s] is not None]
        paired = [s for s in done if s in base]
        fixed = sum(base[s]["failed"] and not got[s]["failed"] for s in paired)
        broke = sum(got[s]["failed"] and not base[s]["failed"] for s in paired)
        last = [got[s]["acc_last"] for s in done]
        diff = paired_difference([base[s]["acc_last"] for s in paired], [got[s]["acc_last"] for s in paired])
        lines.append(f"| {arm} | {len(done)} | {sum(got[s]['failed'] for s in done)} | "
                     + ("—" if arm == "vanilla" else f"{fixed} / {broke} (p = {sign_test(fixed, broke):.3f})")
                     + f" | {', '.join(str(got[s]['onset']) if got[s]['failed'] else '—' for s in done)} | "
                     f"{mean_interval(last).format(3).lstrip('+')} | "
                     + ("—" if arm == "vanilla" else diff.format(3)) + " | "
                     f"{mean_interval([got[s]['acc_best'] for s in done]).format(3).lstrip('+')} |")
    return "\n".join(lines)


def secondary_table(rows: dict[str, dict[int, dict]], arms: list[str], seeds: list[int]) -> str:
    """Markdown of the comparison's secondary measures per arm (``rows[arm][seed]``: :func:`run_row`): LM-head
    gradient norm peak over median (mean over seeds), collapse warnings fired (runs with one / runs), failed runs
    warned before their onset with the median lead in steps, the mean silenced gradient share, and the mean rate of
    sampled tokens with p < 1e-4 at the last checkpoint (``garbage_rate``; runs without one are left out)."""
    lines = ["| arm | LM-head grad norm, peak / median (mean) | runs with a collapse warning | failed runs warned "
             "before the onset (median lead, steps) | silenced gradient share (mean over steps and seeds) | "
             f"sampled tokens with p < {pc.GARBAGE_P:g}, last checkpoint (mean rate, runs) |",
             "|---|---|---|---|---|---|"]
    for arm in arms:
        done = [rows[arm][s] for s in seeds if s in rows.get(arm, {})]
        if not done:
            continue
        failed = [r for r in done if r["failed"]]
        leads = [r["lead"] for r in failed if r["lead"] is not None]
        shares = [r["grad_share_mean"] for r in done if r["grad_share_mean"] is not None]
        peak = [r["lm_peak_over_median"] for r in done if not math.isnan(r["lm_peak_over_median"])]
        peak_cell = f"{statistics.fmean(peak):.2f}" if peak else "—"
        garbage = [r["garbage_rate"] for r in done if r.get("garbage_rate") is not None]
        garbage_cell = f"{statistics.fmean(garbage):.2e} ({len(garbage)})" if garbage else "—"
        lines.append(f"| {arm} | {peak_cell} | {sum(bool(r['warnings']) for r in done)} of "
                     f"{len(done)} | {len(leads)} of {len(failed)}"
                     + (f" ({statistics.median(leads):g})" if leads else "") + " | "
                     + (f"{statistics.fmean(shares):.4f}" if shares else "—") + f" | {garbage_cell} |")
    return "\n".join(lines)


def compare_figures(rows: dict[str, dict[int, dict]], arms: list[str], out: Path, stem: str) -> list[Path]:
    """``<stem>_val_accuracy.png`` and ``<stem>_entropy.png``: per arm its seeds thin and their mean thick, against
    the step (``rows[arm][seed]``: :func:`run_row`, whose ``val`` and ``entropy`` are ``{step: value}``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)  # ``--report --out DIR`` of kept runs: no run has made DIR
    colors = dict(zip(arms, plt.get_cmap("tab10").colors, strict=False))
    written = []
    for key, label in (("val", VAL_KEY), ("entropy", ENTROPY_KEY)):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for arm in arms:
            curves = [r[key] for r in rows.get(arm, {}).values() if r[key]]
            for c in curves:
                ax.plot(sorted(c), [c[k] for k in sorted(c)], color=colors[arm], alpha=0.2, lw=0.8)
            if curves:
                steps = sorted(set.intersection(*(set(c) for c in curves)))
                ax.plot(steps, [statistics.fmean(c[k] for c in curves) for k in steps], color=colors[arm], lw=2,
                        label=f"{arm} (mean of {len(curves)})")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{stem}_{'val_accuracy' if key == 'val' else key}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def search_plan(out: Path, names: list[str], seeds: list[int]) -> list[tuple]:
    """``(candidate, seed, run_dir, env, argv)`` of every search run: the paired comparison's ``vanilla`` arm (the
    keep-all mask, so the LM-head norm is recorded), validation before training and every :data:`TEST_FREQ` steps on
    every validation row, one checkpoint at the end."""
    plan = []
    for cand in (c for c in CANDIDATES if c.name in names):
        for s in seeds:
            run_dir = out / cand.name / f"seed{s}" / "vanilla"
            env, argv = pc.run_command(pc.ARMS["vanilla"], s, run_dir, steps=cand.steps, test_freq=TEST_FREQ,
                                       val_before_train=True, val_max_samples=None, extra=list(cand.overrides))
            plan.append((cand, s, run_dir, env, argv))
    return plan


def search_table(rows: list[dict]) -> str:
    """Markdown of the search: one line per run, then one per candidate (failed seeds, qualifies)."""
    lines = ["| candidate | seed | steps done | failed | onset | criteria | val acc step 0 / best / last | entropy "
             "min / last | LM-head peak / median |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['candidate']} | {r['seed']} | {r['steps_done']} | {'yes' if r['failed'] else 'no'} | "
                     f"{r['onset'] if r['onset'] is not None else '—'} | "
                     f"{', '.join(f'{k} @{v}' for k, v in r['criteria'].items()) or '—'} | "
                     f"{r['acc0']:.3f} / {r['acc_best']:.3f} / {r['acc_last']:.3f} | "
                     f"{r['ent_min']:.3f} / {r['ent_last']:.3f} | {r['lm_peak_over_median']:.2f} |")
    by = {}
    for r in rows:
        by.setdefault(r["candidate"], []).append(r["failed"])
    lines += ["", "| candidate | seeds failed | qualifies (its search seeds, the first two, failed) |", "|---|---|---|"]
    lines += [f"| {c} | {sum(f)} of {len(f)} | {'yes' if len(f) >= SEARCH_SEEDS and all(f[:SEARCH_SEEDS]) else 'no'} |"
              for c, f in by.items()]
    return "\n".join(lines)


def confirm_verdict(rows: list[dict]) -> str:
    """The confirmation's one-line verdict: ``"testbed"`` when at least :data:`CONFIRM_FAILS` of
    :data:`CONFIRM_SEEDS` vanilla seeds failed, ``"not a testbed"`` when that can no longer happen, ``"open"``
    while seeds are missing. ``rows`` are :func:`run_row` outputs of one candidate."""
    failed = sum(r["failed"] for r in rows)
    if failed >= CONFIRM_FAILS:
        return "testbed"
    return "not a testbed" if failed + (CONFIRM_SEEDS - len(rows)) < CONFIRM_FAILS else "open"


def warning_steps(metrics: dict[int, dict], threshold: float = COLLAPSE_Z_THRESHOLD) -> list[int]:
    """The steps at which the plugin's collapse early-warning fired: any of :data:`COLLAPSE_Z_KEYS` with
    |z| > ``threshold`` (the warning's own test, ``stapo_verl.diagnostics.collapse``). Raises nothing."""
    return sorted(s for s, m in metrics.items()
                  if any(key in m and abs(float(m[key])) > threshold for key in COLLAPSE_Z_KEYS))


def run_row(cand: Candidate, seed: int, metrics: dict[int, dict]) -> dict:
    """One line of the search table from a run's metrics, with the comparison's secondary measures: the collapse
    warnings' steps (:func:`warning_steps`), the lead of the first one before the onset (None without a failure
    or without a warning before it), and the mean silenced gradient share (None for a run that does not log it)."""
    v = instability(metrics)
    warns = warning_steps(metrics)
    before = [s for s in warns if v.onset is not None and s < v.onset]
    share = [float(m[GRAD_SHARE_KEY]) for m in metrics.values() if GRAD_SHARE_KEY in m]
    val = {s: float(m[VAL_KEY]) for s, m in metrics.items() if VAL_KEY in m}
    ent = {s: float(m[ENTROPY_KEY]) for s, m in metrics.items() if ENTROPY_KEY in m}
    lm = [float(m[LM_HEAD_KEY]) for _, m in sorted(metrics.items()) if LM_HEAD_KEY in m]
    nan = float("nan")
    return {"candidate": cand.name, "seed": seed, "steps_done": max(ent, default=0), "failed": v.failed,
            "onset": v.onset, "criteria": v.criteria, "acc0": val.get(0, nan),
            "acc_best": max(val.values(), default=nan), "acc_last": val[max(val)] if val else nan,
            "ent_min": min(ent.values(), default=nan), "ent_last": ent[max(ent)] if ent else nan,
            "lm_peak_over_median": max(lm) / statistics.median(lm) if lm else nan,
            "val": val, "entropy": ent, "warnings": warns, "warnings_before_onset": len(before),
            "lead": v.onset - before[0] if before else None,
            "grad_share_mean": statistics.fmean(share) if share else None}


def cpu_type(cpuinfo: str | None = None) -> str:
    """The CPU type a run's numbers hold for: ``/proc/cpuinfo``'s model name, family and model, and which of
    :data:`CPU_FLAGS` it has (e.g. ``"AMD EPYC family 25 model 17 avx2 avx512f avx512_bf16"``); ``platform``'s
    processor name where there is no ``/proc/cpuinfo``."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.exists():
            return platform.processor() or platform.machine()
        cpuinfo = path.read_text()
    fields = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    return " ".join([fields.get("model name", "?"), "family", fields.get("cpu family", "?"), "model",
                     fields.get("model", "?"), *[f for f in CPU_FLAGS if f in flags]])


def metrics_digest(metrics: dict[int, dict]) -> str:
    """sha256 of every reproducible metric of a run (``{step: {key: value}}``; not time, speed or memory:
    :func:`stapo_verl.diagnostics.reproducibility.reproducible`), in a canonical JSON form."""
    from stapo_verl.diagnostics.reproducibility import reproducible

    kept = reproducible(metrics)
    text = json.dumps({str(k): kept[k] for k in sorted(kept)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def stored_path(store: Path, cand: Candidate, arm: str, seed: int) -> Path:
    """Where :func:`store_run` keeps one run: ``store/<candidate>/<arm>_seed<seed>.json``."""
    return store / cand.name / f"{arm}_seed{seed}.json"


def store_run(store: Path, cand: Candidate, arm: str, seed: int, metrics: dict[int, dict], cpu: str,
              garbage: dict | None = None) -> Path:
    """Keep a finished run: per step the :data:`STORED_KEYS` it has, :func:`metrics_digest` of all its metrics, the
    CPU type and ``garbage`` (:func:`paired_comparison.garbage_rate` of its last checkpoint, or None). Returns the
    file written."""
    path = stored_path(store, cand, arm, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = {str(s): {k: metrics[s][k] for k in STORED_KEYS if k in metrics[s]} for s in sorted(metrics)}
    record = {"candidate": cand.name, "arm": arm, "seed": seed, "steps": cand.steps, "cpu": cpu,
              "digest": metrics_digest(metrics), "garbage_rate": garbage,
              "metrics": {s: m for s, m in kept.items() if m}}
    path.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    return path


def load_stored(store: Path, cand: Candidate, arm: str, seed: int, cpu: str) -> dict | None:
    """The record :func:`store_run` kept of this run on this CPU type (its ``metrics`` as ``{step: {key: value}}``),
    or None (not kept, or kept from another CPU type or another number of steps)."""
    path = stored_path(store, cand, arm, seed)
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record["cpu"] != cpu or record["steps"] != cand.steps:
        return None
    record["metrics"] = {int(s): m for s, m in record["metrics"].items()}
    return record


def differing_values(kept: dict[int, dict], metrics: dict[int, dict]) -> tuple[int, int]:
    """``(differing, compared)``: how many of the kept values (``{step: {key: value}}``) a new run's metrics do not
    reproduce exactly (a value missing from the new run counts as differing)."""
    compared = differing = 0
    for step, values in kept.items():
        for key, value in values.items():
            compared += 1
            differing += metrics.get(step, {}).get(key, object()) != value
    return differing, compared


def last_checkpoint_garbage(run_dir: Path, assets: Path, *, seed: int, steps: int, prompts: int) -> dict | None:
    """:func:`paired_comparison.garbage_rate` of a finished run's last checkpoint (one thread, so the number does not
    depend on the machine's load), cached in ``run_dir/garbage_rate.json``; None when the checkpoint is gone."""
    cache = run_dir / "garbage_rate.json"
    if not cache.exists():
        if not (run_dir / "ckpt" / f"global_step_{steps}" / "actor").exists():
            return None
        import torch

        torch.set_num_threads(1)
        cache.write_text(json.dumps(pc.garbage_rate(run_dir, assets, seed=seed, step=steps, prompts=prompts)))
    return json.loads(cache.read_text())


def keep_finished(a, store: Path, cand: Candidate, arm: str, seed: int, run_dir: Path, cpu: str) -> dict | None:
    """The kept record of one comparison run (:func:`load_stored`), first (re)written from ``run_dir`` when that
    holds a finished run the store lacks or holds otherwise (with its last checkpoint's p < 1e-4 rate); None when
    the run is neither finished nor kept."""
    kept = load_stored(store, cand, arm, seed, cpu)
    if not pc.run_done(run_dir, cand.steps):
        return kept
    metrics = pc.read_metrics(run_dir / "metrics.jsonl")
    garbage = last_checkpoint_garbage(run_dir, a.assets, seed=seed, steps=cand.steps, prompts=a.garbage_prompts)
    if kept is not None and kept["digest"] != metrics_digest(metrics):
        print(f"[instability] {arm} seed {seed}: this run's metrics differ from the kept run's "
              f"({stored_path(store, cand, arm, seed)}); the kept one is replaced", flush=True)
    if kept is None or kept["digest"] != metrics_digest(metrics) or kept.get("garbage_rate") != garbage:
        store_run(store, cand, arm, seed, metrics, cpu, garbage)
    return load_stored(store, cand, arm, seed, cpu)


def compare(a, known: list[str]) -> int:
    """``--compare``: the arms in a confirmed testbed (pre-registered comparison); writes ``compare_<cand>.md``."""
    if a.compare not in known:
        raise SystemExit(f"--compare: unknown candidate {a.compare!r}; known: {known}")
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    if unknown := [x for x in arms if x not in TESTBED_ARMS]:
        raise SystemExit(f"--arms: unknown arm(s) {unknown}; known: {list(TESTBED_ARMS)}")
    arms = ["vanilla", *[x for x in arms if x != "vanilla"]]
    cand = next(c for c in CANDIDATES if c.name == a.compare)
    seeds, out, store, cpu = list(range(1, a.seeds + 1)), a.out.resolve(), a.store.resolve(), cpu_type()
    plan = compare_plan(out, cand, arms, seeds)
    rerun = None
    if a.rerun:
        arm, _, seed = a.rerun.partition(":")
        rerun = (arm, int(seed) if seed.isdigit() else -1)
        plan = [p for p in plan if (p[0], p[1]) == rerun]
        if not plan or load_stored(store, cand, *rerun, cpu) is None:
            raise SystemExit(f"--rerun {a.rerun}: no run kept of that arm and seed on this CPU type ({cpu}) in {store}")
        # the command itself names its directory (STAPO_RUN_DIR): build it for OUT/rerun, or the run would write
        # into (and resume from) the comparison's own directory while the check reads an empty one
        plan = compare_plan(out / "rerun", cand, [rerun[0]], [rerun[1]])
    if a.dry:
        for _, _, _, env, cmd in plan:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(cmd))
        return 0
    t0 = time.time()
    for k, (arm, s, run_dir, env, cmd) in enumerate(plan, 1):
        if rerun is not None:
            shutil.rmtree(run_dir, ignore_errors=True)  # an earlier rerun's checkpoint would be resumed, not rerun
            (run_dir.parent / f"{run_dir.name}.console.log").unlink(missing_ok=True)
        elif a.report or pc.run_done(run_dir, cand.steps) or load_stored(store, cand, arm, s, cpu) is not None:
            continue
        print(f"[instability] compare {k}/{len(plan)} {arm} seed {s} ({time.time() - t0:.0f} s so far)", flush=True)
        started = time.time()
        rc = pc.run_logged(cmd, env, run_dir)
        print(f"[instability] {arm} seed {s}: exit {rc} in {time.time() - started:.0f} s", flush=True)
        if rerun is None:
            keep_finished(a, store, cand, arm, s, run_dir, cpu)  # at once: outputs/ does not outlive the clone
        else:
            metrics = pc.read_metrics(run_dir / "metrics.jsonl") if pc.run_done(run_dir, cand.steps) else {}
            kept = load_stored(store, cand, arm, s, cpu)
            differing, compared = differing_values(kept["metrics"], metrics)
            same = metrics_digest(metrics) == kept["digest"]
            print(f"[instability] rerun of {arm} seed {s}: {differing} of {compared} kept values differ; every metric "
                  f"{'identical' if same else 'NOT identical'} (digest)", flush=True)
            return 0 if same and not differing else 1
    rows: dict[str, dict[int, dict]] = {}
    for arm, s, run_dir, _, _ in plan:
        kept = keep_finished(a, store, cand, arm, s, run_dir, cpu)
        if kept is not None:
            garbage = kept.get("garbage_rate")
            rows.setdefault(arm, {})[s] = {**run_row(cand, s, kept["metrics"]),
                                           "garbage_rate": None if garbage is None else garbage["rate"]}
    text = "\n".join([f"# Comparison in {cand.name} ({cand.about}, {cand.steps} steps), seeds 1-{a.seeds}", "",
                      compare_table(rows, arms, seeds), "", "Secondary measures:", "",
                      secondary_table(rows, arms, seeds), "",
                      "Arms: " + "; ".join(f"`{x}` = {TESTBED_ARMS[x].about}" for x in arms) + ".", "",
                      f"Figures: `compare_{cand.name}_val_accuracy.png`, `compare_{cand.name}_entropy.png`.", "",
                      f"CPU: {cpu}. Command: `python benchmarks/instability_testbed.py {shlex.join(sys.argv[1:])}`"])
    compare_figures(rows, arms, out, f"compare_{cand.name}")
    (out / f"compare_{cand.name}.md").write_text(text + "\n")
    (out / f"compare_{cand.name}.json").write_text(json.dumps(rows, indent=1, default=str))
    print(text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--search", action="store_true", help="run the search (vanilla, 2 seeds per candidate)")
    ap.add_argument("--only", default=None, help=f"comma-separated candidates; known: {[c.name for c in CANDIDATES]}")
    ap.add_argument("--confirm", default=None, metavar="CANDIDATE",
                    help=f"run a qualifying candidate with {CONFIRM_SEEDS} vanilla seeds (1-{CONFIRM_SEEDS})")
    ap.add_argument("--compare", default=None, metavar="CANDIDATE",
                    help="run the comparison's arms in a confirmed testbed (seeds 1-N, vanilla reused)")
    ap.add_argument("--arms", default=",".join(TESTBED_ARMS), help=f"comma-separated; known: {list(TESTBED_ARMS)}")
    ap.add_argument("--seeds", type=int, default=CONFIRM_SEEDS, help="--compare: seeds 1..N")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "instability")
    ap.add_argument("--dry", action="store_true", help="print the commands and exit")
    ap.add_argument("--report", action="store_true", help="--compare: write the table of the finished runs only")
    ap.add_argument("--store", type=Path, default=STORE, help="--compare: where finished runs are kept (committed)")
    ap.add_argument("--garbage-prompts", type=int, default=256,
                    help=f"--compare: validation prompts of the p < {pc.GARBAGE_P:g} rate at the last checkpoint")
    ap.add_argument("--assets", type=Path, default=Path(os.environ.get("STAPO_ASSETS") or
                                                        Path.home() / ".cache" / "stapo_verl" / "tiny"))
    ap.add_argument("--rerun", default=None, metavar="ARM:SEED",
                    help="--compare: run a kept run again (under OUT/rerun) and count the values that differ")
    a = ap.parse_args(argv)
    if sum(map(bool, (a.search, a.confirm, a.compare))) != 1:
        ap.error("say one of --search, --confirm CANDIDATE or --compare CANDIDATE")
    known = [c.name for c in CANDIDATES]
    if a.compare:
        return compare(a, known)
    if a.confirm:
        names, seeds = [a.confirm], list(range(1, CONFIRM_SEEDS + 1))
        if a.confirm not in known:
            ap.error(f"--confirm: unknown candidate {a.confirm!r}; known: {known}")
    else:
        names = known if a.only is None else [x.strip() for x in a.only.split(",") if x.strip()]
        seeds = list(range(a.first_seed, a.first_seed + SEARCH_SEEDS))
    if unknown := [x for x in names if x not in known]:
        ap.error(f"--only: unknown candidate(s) {unknown}; known: {known}")
    out = a.out.resolve()
    plan = search_plan(out, names, seeds)
    if a.dry:
        for _, _, _, env, cmd in plan:
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(cmd))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for k, (cand, s, run_dir, env, cmd) in enumerate(plan, 1):
        if pc.run_done(run_dir, cand.steps):
            print(f"[instability] {k}/{len(plan)} {cand.name} seed {s}: done before, kept", flush=True)
            continue
        print(f"[instability] {k}/{len(plan)} {cand.name} seed {s} ({time.time() - t0:.0f} s so far)", flush=True)
        started = time.time()
        rc = pc.run_logged(cmd, env, run_dir)
        print(f"[instability] {cand.name} seed {s}: exit {rc} in {time.time() - started:.0f} s", flush=True)
    rows = [run_row(cand, s, pc.read_metrics(run_dir / "metrics.jsonl"))
            for cand, s, run_dir, _, _ in plan if (run_dir / "metrics.jsonl").exists()]
    title = f"Confirmation of {a.confirm}" if a.confirm else "Instability search"
    text = "\n".join([f"# {title} (vanilla, seeds {seeds[0]}-{seeds[-1]})", "",
                      "Criterion: benchmarks/instability_testbed.py (pre-registered). Candidates: "
                      + "; ".join(f"`{c.name}` = {c.about}, {c.steps} steps" for c in CANDIDATES if c.name in names)
                      + ".", "", search_table(rows), ""]
                     + ([f"Verdict: **{confirm_verdict(rows)}** ({sum(r['failed'] for r in rows)} of {len(rows)} "
                         f"seeds failed; a testbed needs {CONFIRM_FAILS} of {CONFIRM_SEEDS})", ""] if a.confirm else [])
                     + [f"Command: `python benchmarks/instability_testbed.py {shlex.join(sys.argv[1:])}`"])
    stem = f"confirm_{a.confirm}" if a.confirm else "search"
    (out / f"{stem}.md").write_text(text + "\n")
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
