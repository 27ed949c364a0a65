"""Benchmark: the second instability testbed, built so that it can test STAPO's claim, with its design fixed
before any of its runs.

The first testbed (``benchmarks/instability_testbed.py``, setting ``lr4e-4``) could not confirm or refute the paper's
claim (arXiv 2602.15620 §1, §5: GRPO-style training fails late, driven by rare low-probability low-entropy tokens
with positive advantage, and silencing them prevents it): (a) one optimizer mini-batch per step and one epoch, so
every update happens at the old policy, the importance ratio is exactly 1, clipping never acts and the old-policy and
current-policy statistics are the same tensor; (b) its accuracy criterion fires on validation noise (a flat plateau
with the mean@1 validation's 2-point sampling error "fails" about 14-19 % of the time) and every arm failed 5 of 5;
(c) its rare tokens come from the warm start's label smoothing, not from anything that breeds. This testbed changes
the three, and adds a stable control.

Pre-registration (fixed in this docstring, in a commit before any run of this file other than its smoke run;
changing it afterwards needs a new commit that says why)
====================================================================================================================

**Recipe** (every setting): the tiny recipe (``bash recipes/run.sh tiny <method>``) with
``actor_rollout_ref.actor.ppo_mini_batch_size=4`` (:data:`MINI_BATCH_PROMPTS`): 16 prompts x 8 samples a step in 4
optimizer mini-batches of 32 sequences, one epoch, the paper's 4 mini-batches per step. Mini-batches 2-4 update a
policy that has moved, so ``actor/pg_clipfrac`` can be > 0 and the old-policy statistics differ from the
current ones. Validation: every :data:`VAL_FREQ` = 20 steps and before training, on all 640 validation rows, 4
samples each at T = 1 (a checkpoint every :data:`CKPT_FREQ` = 10 steps; the smoke run measured a mean@4
validation at about 19 training steps' cost, so every 10 steps would have made validation two thirds of a run) (``VAL_N=4``; key :data:`VAL_KEY` ``val-core/math_dapo/acc/mean@4``).

**Failure of a run** (:func:`verdict`): any of three, judged after the first :data:`WARMUP_STEPS` = 10 steps:

1. *accuracy collapse*: at :data:`ACC_RUN` = 2 consecutive validation points mean@4 accuracy is at least
   :data:`ACC_DROP` = 0.08 below its running best (every earlier validation point, step 0 included);
2. *entropy rebound*: the trailing :data:`ENTROPY_SMOOTH` = 5-step mean of ``actor/entropy`` is >= 1.5 x the
   running minimum of its earlier values for 3 consecutive steps (the first testbed compared single steps: a flat
   plateau with the kept runs' step noise then "fails" about 6 % of the time on entropy alone);
3. *gradient blow-up*: ``actor/stapo/lm_head_grad_norm`` > 5 x the median of its previous 10 steps (as the first).

Calibration (:func:`false_fail_rate`, a unit test): a perfectly flat plateau of 100 steps whose validation points
carry only the validation's sampling error, whose entropy and LM-head norm carry the step-to-step noise measured in
the first testbed's kept runs (:data:`ENTROPY_LOG_SD`, :data:`LM_HEAD_LOG_SD`), must "fail" <= 5 % of the time, at
the mean@4 validation's error bound :data:`VAL_SE_BOUND` (0.99 points: ``sqrt(0.25 / (4 x 640))``) and at twice it
(the mean@1 validation's 2 points); and a sustained drop of 10 points must be detected >= 95 % of the time. The
sampling error of each validation is also measured from its generations (:func:`validation_se`).

**Settings** (:data:`SETTINGS`), vanilla first:

* ``mb4_lr5e-5`` -- the **stable control**: lr 5e-5 (4 optimizer steps of 5e-5 move the weights about as far per
  RL step as the tiny recipe's one step of 2e-4, which raised accuracy without any failure in 20-step runs), 100
  steps. The criterion must stay silent: at most 1 of 5 vanilla seeds may fail (with a 5 % per-run false-fail rate,
  1 of 5 happens 23 % of the time; 2 of 5, 2 %). If 2 or more fail, the criterion or the control is wrong, and the
  comparison below is not run before that is resolved and re-registered.
* ``mb4_lr2e-4`` and ``mb4_lr4e-4`` -- the **searched failing setting**: vanilla, seeds 1-2 each, in this order;
  the first whose two seeds both fail is confirmed with seeds 1-5 (a testbed when >= 3 of 5 fail), 100 steps.
* ``planted_mb4_lr2e-4`` -- the **planted spurious token** (``benchmarks/planted_token.py``): the planted warm
  start, lr 2e-4, 150 steps, a checkpoint every 10 steps (p(J) on fixed prefixes), the silenced-token dump (all
  silenced tokens, for the mask's precision and recall against J) and verl's rollout dump (J's in correct
  responses).

**Arms** (:data:`ARMS`), paired over seeds 1-5 (the arms of one seed share every random draw until their weights
differ): ``vanilla`` (verl's vanilla loss, keep-all mask), ``stapo`` (S2T, τ_p 0.1, the testbed's), ``stapo_paper_tau``
(S2T, τ_p 0.002, the paper's), ``s2t_random`` (as many candidates silenced, at random), ``top_entropy``
(20-Entropy), and ``stapo_current`` (S2T at τ_p 0.1 with ``stats_source=current_minibatch``: the share of silenced
tokens on which old-policy and current statistics disagree, ``actor/stapo/mask_disagreement`` over
``actor/stapo/num_masked``, and its effect on the outcome).

**Primary measures**: (a) the number of failed seeds per arm with the discordant pairs against vanilla and the exact
sign test; (b) mean@4 accuracy at the last step, the paired mean difference to vanilla with its 95 % t interval. In
``planted_mb4_lr2e-4`` also: (c) p(J) on fixed prefixes at every checkpoint; (d) the mask's precision (share of
silenced tokens that are J) and recall (share of J's sampled in correct responses of mixed groups that are silenced).
**Secondary**: onsets, entropy, ``actor/pg_clipfrac``, ``actor/ppo_kl``, the disagreement share, the silenced gradient
share. If vanilla does not fail in the planted setting, that is the result, reported with why (p(J) over steps).

Usage::

    python benchmarks/offpolicy_testbed.py --setting mb4_lr5e-5 --arms vanilla            # the control, seeds 1-5
    python benchmarks/offpolicy_testbed.py --setting mb4_lr2e-4 --arms vanilla --seeds 2  # the search
    python benchmarks/offpolicy_testbed.py --setting planted_mb4_lr2e-4                   # every arm, seeds 1-5
    python benchmarks/offpolicy_testbed.py --setting planted_mb4_lr2e-4 --smoke --arms stapo_current --seeds 1
    python benchmarks/offpolicy_testbed.py --setting ... --rerun ARM:SEED                 # 0 differing values?
    python benchmarks/offpolicy_testbed.py --setting ... --report                         # the tables, kept runs only

Runs go to ``OUT/<setting>/seed<s>/<arm>`` (default ``outputs/offpolicy``); a finished run is kept at once in
``benchmarks/results/offpolicy/<setting>/<arm>_seed<s>.json`` (the metrics the tables read, a digest of all of them,
the CPU type; ``--smoke`` runs under ``<setting>_smoke``) and is not run again on the same CPU type.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import instability_testbed as tb  # noqa: E402  (sibling script: the criteria it shares, digest, CPU type)
import paired_comparison as pc  # noqa: E402  (sibling script: the runner and metrics reader)

REPO = pc.REPO
A = "actor_rollout_ref"
PL = f"{A}.actor.policy_loss"
#: prompts per optimizer mini-batch: 16 prompts a step / 4 = the paper's 4 mini-batches per step
MINI_BATCH_PROMPTS = 4
#: validation samples per prompt, and its accuracy key
VAL_N = 4
VAL_KEY = f"val-core/math_dapo/acc/mean@{VAL_N}"
#: validation rows (all of them) and the sampling-error bound of a mean@VAL_N accuracy over them (p = 0.5)
VAL_ROWS = 640
VAL_SE_BOUND = math.sqrt(0.25 / (VAL_N * VAL_ROWS))
WARMUP_STEPS = tb.WARMUP_STEPS
#: validation every VAL_FREQ steps (and before training); a checkpoint every CKPT_FREQ steps
VAL_FREQ, CKPT_FREQ = 20, 10
#: accuracy collapse: this far below the running best, on this many consecutive validation points
ACC_DROP, ACC_RUN = 0.08, 2
#: per-step noise of log(actor/entropy) and log(LM-head grad norm) in the first testbed's kept runs (largest
#: of the ten vanilla and stapo runs; :func:`measured_step_noise` recomputes them, a unit test holds the two equal)
ENTROPY_LOG_SD, LM_HEAD_LOG_SD = 0.101, 0.317
#: entropy rebound: the trailing mean over this many steps, this ratio to its running minimum, this many steps
ENTROPY_SMOOTH, ENTROPY_RISE, ENTROPY_RUN = 5, tb.ENTROPY_RISE, tb.ENTROPY_RUN
#: what a run keeps of each step (the tables' inputs)
STORED_KEYS = (VAL_KEY, pc.ENTROPY_KEY, pc.LM_HEAD_KEY, *tb.COLLAPSE_Z_KEYS, tb.GRAD_SHARE_KEY, "actor/pg_clipfrac",
               "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/stapo/num_masked", "actor/stapo/masked_frac",
               "actor/stapo/mask_disagreement", "actor/stapo/mask_disagreement_frac", "critic/score/mean")
STORE = REPO / "benchmarks" / "results" / "offpolicy"
SEEDS = 5


@dataclass(frozen=True)
class Setting:
    """A setting of this testbed: the tiny recipe with :data:`MINI_BATCH_PROMPTS`, ``VAL_N`` validation and these
    overrides, for ``steps`` steps; ``planted``: the planted-token assets and their measurements."""

    name: str
    steps: int
    overrides: tuple = ()
    planted: bool = False
    about: str = ""


SETTINGS = {s.name: s for s in (
    Setting("mb4_lr5e-5", 100, (f"{A}.actor.optim.lr=5e-5",), about="the stable control: lr 5e-5"),
    Setting("mb4_lr2e-4", 100, (f"{A}.actor.optim.lr=2e-4",), about="search: lr 2e-4"),
    Setting("mb4_lr4e-4", 100, (f"{A}.actor.optim.lr=4e-4",), about="search: lr 4e-4"),
    Setting("planted_mb4_lr2e-4", 150, (f"{A}.actor.optim.lr=2e-4",), planted=True,
            about="the planted spurious token J, lr 2e-4"),
)}

#: the arms (module docstring), vanilla first
ARMS = {
    "vanilla": pc.ARMS["vanilla"],
    "stapo": pc.ARMS["stapo"],
    "stapo_paper_tau": tb.TESTBED_ARMS["stapo_paper_tau"],
    "s2t_random": tb.TESTBED_ARMS["s2t_random"],
    "top_entropy": pc.ARMS["top_entropy"],
    "stapo_current": pc.Arm("stapo_current", "stapo", overrides=(f"{PL}.stats_source=current_minibatch",),
                            about="S2T (τ_p 0.1) from the current policy's statistics of each mini-batch"),
}
#: arms that run an S2T-family mask (the silenced-token dump works with these)
S2T_ARMS = ("stapo", "stapo_paper_tau", "s2t_random", "stapo_current")


# ----------------------------------------------------------------------------- the criterion
@dataclass(frozen=True)
class Verdict:
    """What :func:`verdict` found: ``failed``, the earliest ``onset`` (None when not failed) and ``{criterion:
    onset}`` for each criterion met (``accuracy``, ``entropy``, ``grad``)."""

    failed: bool
    onset: int | None
    criteria: dict = field(default_factory=dict)


def accuracy_onset(val: dict[int, float], drop: float = ACC_DROP, run: int = ACC_RUN) -> int | None:
    """The first of ``run`` consecutive validation points after :data:`WARMUP_STEPS` that are each at least
    ``drop`` below the running best of every earlier point (``val``: ``{step: accuracy}``); None if there is none."""
    best, below = -math.inf, []
    for step in sorted(val):
        if step > WARMUP_STEPS and val[step] <= best - drop:
            below.append(step)
            if len(below) == run:
                return below[0]
        else:
            below = []
        best = max(best, val[step])
    return None


def entropy_onset(ent: dict[int, float], smooth: int = ENTROPY_SMOOTH) -> int | None:
    """The first of :data:`ENTROPY_RUN` consecutive steps after :data:`WARMUP_STEPS` at which the trailing
    ``smooth``-step mean of ``ent`` (``{step: entropy}``; a step's mean needs ``smooth`` steps) is at least
    :data:`ENTROPY_RISE` times the running minimum of the earlier means; None if there is none."""
    steps = sorted(ent)
    low, run = math.inf, []
    for i in range(smooth - 1, len(steps)):
        step, mean = steps[i], statistics.fmean(ent[s] for s in steps[i - smooth + 1:i + 1])
        if step > WARMUP_STEPS and mean >= ENTROPY_RISE * low:
            run.append(step)
            if len(run) == ENTROPY_RUN:
                return run[0]
        else:
            run = []
        low = min(low, mean)
    return None


def verdict(metrics: dict[int, dict]) -> Verdict:
    """The pre-registered failure criterion (module docstring) of one run.

    Args:
        metrics: ``{step: {key: value}}`` (:func:`paired_comparison.read_metrics`; a kept run's ``metrics``).
            Steps without a key are skipped for that criterion.

    Returns:
        a :class:`Verdict`. Raises nothing.
    """
    series = {key: {s: float(m[key]) for s, m in metrics.items() if key in m}
              for key in (VAL_KEY, pc.ENTROPY_KEY, pc.LM_HEAD_KEY)}
    onsets = {"accuracy": accuracy_onset(series[VAL_KEY]), "entropy": entropy_onset(series[pc.ENTROPY_KEY]),
              "grad": tb._grad_onset(series[pc.LM_HEAD_KEY])}
    met = {k: v for k, v in onsets.items() if v is not None}
    return Verdict(bool(met), min(met.values()) if met else None, met)


def plateau_metrics(rng: random.Random, *, val_se: float, steps: int = 100, val_freq: int = VAL_FREQ,
                    level: float = 0.65,
                    drop: float = 0.0, drop_points: int = 3, entropy_log_sd: float = ENTROPY_LOG_SD,
                    lm_head_log_sd: float = LM_HEAD_LOG_SD) -> dict[int, dict]:
    """A simulated run on a flat plateau (``{step: {key: value}}`` as :func:`verdict` reads it): validation every
    ``val_freq`` steps and at step 0 at ``level`` plus N(0, ``val_se``), the last ``drop_points`` of them
    ``drop`` lower (0: flat); entropy 0.2 and LM-head norm 1.0 times exp(N(0, sd)) at every step."""
    out: dict[int, dict] = {}
    val_steps = list(range(0, steps + 1, val_freq))
    for k, s in enumerate(val_steps):
        shift = drop if k >= len(val_steps) - drop_points else 0.0
        out.setdefault(s, {})[VAL_KEY] = level - shift + rng.gauss(0.0, val_se)
    for s in range(1, steps + 1):
        out.setdefault(s, {})[pc.ENTROPY_KEY] = 0.2 * math.exp(rng.gauss(0.0, entropy_log_sd))
        out[s][pc.LM_HEAD_KEY] = math.exp(rng.gauss(0.0, lm_head_log_sd))
    return out


def false_fail_rate(val_se: float, *, trials: int = 2000, seed: int = 0, **plateau) -> float:
    """Share of ``trials`` simulated runs (:func:`plateau_metrics`, ``val_se`` and ``plateau``'s settings) that
    :func:`verdict` calls failed: on a flat plateau its false-fail rate, with ``drop`` its power. Seeded."""
    rng = random.Random(seed)
    return sum(verdict(plateau_metrics(rng, val_se=val_se, **plateau)).failed for _ in range(trials)) / trials


def measured_step_noise(store: Path = tb.STORE / "lr4e-4", arms: tuple = ("vanilla", "stapo")) -> dict:
    """The per-step noise of log entropy and log LM-head norm in the first testbed's kept runs: per run, the sd of
    the step-to-step differences divided by sqrt 2 (the drift cancels), entropy from step 50 and the norm from
    step 20 (after the fast early fall); the largest over the runs. Returns ``{"entropy_log_sd",
    "lm_head_log_sd", "runs"}``."""
    ent_sd, lm_sd = [], []
    for path in sorted(store.glob("*_seed*.json")):
        if path.name.rsplit("_seed", 1)[0] not in arms:
            continue
        m = json.loads(path.read_text())["metrics"]
        steps = sorted(int(s) for s in m)
        ent = [math.log(m[str(s)][pc.ENTROPY_KEY]) for s in steps if pc.ENTROPY_KEY in m[str(s)]]
        lm = [math.log(m[str(s)][pc.LM_HEAD_KEY]) for s in steps if pc.LM_HEAD_KEY in m[str(s)]]
        ent_sd.append(statistics.pstdev([b - a for a, b in zip(ent[50:], ent[51:])]) / math.sqrt(2))
        lm_sd.append(statistics.pstdev([b - a for a, b in zip(lm[20:], lm[21:])]) / math.sqrt(2))
    return {"entropy_log_sd": max(ent_sd), "lm_head_log_sd": max(lm_sd), "runs": len(ent_sd)}


def validation_se(generations: Path) -> dict:
    """The sampling error of one validation's mean@k accuracy, from verl's validation dump
    (``trainer.validation_data_dir``: one JSON line per sample with ``input`` and ``score``; the samples of a prompt
    share its ``input``): se = sqrt(sum_i s_i^2 / k_i) / N over the N prompts, s_i^2 the unbiased variance of prompt
    i's k_i scores mapped to {0, 1}. Returns ``{"acc", "se", "prompts", "k"}``. Raises ValueError when a prompt has
    fewer than 2 samples."""
    groups: dict[str, list[float]] = {}
    for line in Path(generations).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            groups.setdefault(row["input"], []).append(1.0 if float(row["score"]) > 0 else 0.0)
    if any(len(g) < 2 for g in groups.values()):
        raise ValueError(f"{generations}: a prompt has fewer than 2 samples; the se needs validation n >= 2")
    n = len(groups)
    var = sum(statistics.variance(g) / len(g) for g in groups.values())
    return {"acc": statistics.fmean(statistics.fmean(g) for g in groups.values()), "se": math.sqrt(var) / n,
            "prompts": n, "k": max(len(g) for g in groups.values())}


# ----------------------------------------------------------------------------- the runs
def run_command(setting: Setting, arm: str, seed: int, run_dir: Path, *, smoke: bool = False,
                assets: Path | None = None) -> tuple[dict, list[str]]:
    """``(environment additions, argv)`` of one run of ``arm`` in ``setting`` (module docstring): the paired
    comparison's command with 4 mini-batches and mean@4 validation; checkpoints every :data:`CKPT_FREQ` steps (all
    kept) for vanilla (the counterfactual's) and every arm of the planted setting; in the planted setting also the
    planted assets, the silenced-token dump (S2T arms) and verl's rollout dump.
    ``smoke``: 3 steps, validation on 32 rows at step 0 and 3, a checkpoint at step 3 (plumbing only)."""
    steps, freq, ckpt = (3, 3, 3) if smoke else (setting.steps, VAL_FREQ, CKPT_FREQ)
    extra = [f"{A}.actor.ppo_mini_batch_size={MINI_BATCH_PROMPTS}"]
    if setting.planted or arm == "vanilla":  # p(J) over checkpoints; the counterfactual reads vanilla's
        extra += [f"trainer.save_freq={ckpt}", "trainer.max_actor_ckpt_to_keep=null"]
    if setting.planted:
        extra.append(f"trainer.rollout_data_dir='{run_dir / 'rollout'}'")
        if arm in S2T_ARMS:
            extra += [f"{PL}.dump_tokens=True", f"{PL}.dump_max_rows_per_step=8192"]
    extra += setting.overrides  # last: they win
    env, argv = pc.run_command(ARMS[arm], seed, run_dir, steps=steps, test_freq=freq, val_before_train=True,
                               val_max_samples=32 if smoke else None, extra=extra)
    env = {**env, "VAL_N": str(VAL_N)}
    if setting.planted:
        env["STAPO_ASSETS"] = str(assets)
    return env, argv


def store_dir(store: Path, setting: Setting, smoke: bool) -> Path:
    """Where the kept runs of ``setting`` live: ``store/<setting>`` (``<setting>_smoke`` for smoke runs)."""
    return store / (setting.name + ("_smoke" if smoke else ""))


def keep_run(path: Path, setting: Setting, arm: str, seed: int, steps: int, metrics: dict[int, dict], cpu: str,
             extra: dict | None = None) -> dict:
    """Write the kept record of a finished run to ``path`` (the :data:`STORED_KEYS` of each step, the digest of every
    reproducible metric, the CPU type, ``extra``: the planted measurements) and return it."""
    kept = {str(s): {k: metrics[s][k] for k in STORED_KEYS if k in metrics[s]} for s in sorted(metrics)}
    record = {"setting": setting.name, "arm": arm, "seed": seed, "steps": steps, "cpu": cpu,
              "digest": tb.metrics_digest(metrics), "metrics": {s: m for s, m in kept.items() if m},
              **({"planted": extra} if extra else {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")
    return record


def load_kept(path: Path, cpu: str, steps: int) -> dict | None:
    """A kept record made on this CPU type with this many steps (``metrics`` keyed by int step), or None."""
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record["cpu"] != cpu or record["steps"] != steps:
        return None
    record["metrics"] = {int(s): m for s, m in record["metrics"].items()}
    return record


def run_row(record: dict) -> dict:
    """One run's line of the tables from its kept record: the verdict, accuracy (step 0, best, last), entropy
    (last), and the means over steps of the clip fraction, ``ppo_kl``, the silenced count and the disagreement share
    (disagreeing keep decisions / silenced tokens, over the steps that log both)."""
    m = record["metrics"]
    v = verdict(m)
    val = {s: float(x[VAL_KEY]) for s, x in m.items() if VAL_KEY in x}

    def mean(key):
        xs = [float(x[key]) for x in m.values() if key in x]
        return statistics.fmean(xs) if xs else None

    pairs = [(float(x["actor/stapo/mask_disagreement"]), float(x["actor/stapo/num_masked"]))
             for x in m.values() if "actor/stapo/mask_disagreement" in x and "actor/stapo/num_masked" in x]
    nan = math.nan
    ent = {s: float(x[pc.ENTROPY_KEY]) for s, x in m.items() if pc.ENTROPY_KEY in x}
    return {"failed": v.failed, "onset": v.onset, "criteria": v.criteria, "acc0": val.get(0, nan),
            "acc_best": max(val.values(), default=nan), "acc_last": val[max(val)] if val else nan,
            "ent_last": ent[max(ent)] if ent else nan, "clipfrac": mean("actor/pg_clipfrac"),
            "ppo_kl": mean("actor/ppo_kl"), "num_masked": mean("actor/stapo/num_masked"),
            "disagreement_share": (sum(d for d, _ in pairs) / sum(k for _, k in pairs))
            if pairs and sum(k for _, k in pairs) > 0 else None}


def table(rows: dict[str, dict[int, dict]], arms: list[str], seeds: list[int]) -> str:
    """Markdown of the comparison: per arm the failed seeds (discordant pairs against vanilla, exact sign test), the
    onsets, last-step accuracy (mean, 95 % t interval) and its paired difference to vanilla, the mean clip
    fraction and the disagreement share. ``rows[arm][seed]``: :func:`run_row`."""
    from stapo_verl.diagnostics.paired import mean_interval, paired_difference

    base = rows.get("vanilla", {})
    lines = ["| arm | runs | failed | vanilla failed, arm not / the reverse (sign test p) | onsets | "
             f"{VAL_KEY}, last (mean ± 95 % CI) | − vanilla (paired 95 % CI) | pg_clipfrac (mean) | "
             "silenced tokens the two statistics disagree on |", "|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        got = {s: rows.get(arm, {}).get(s) for s in seeds}
        done = [s for s in seeds if got[s] is not None]
        if not done:
            continue
        paired = [s for s in done if s in base]
        fixed = sum(base[s]["failed"] and not got[s]["failed"] for s in paired)
        broke = sum(got[s]["failed"] and not base[s]["failed"] for s in paired)
        clip = [got[s]["clipfrac"] for s in done if got[s]["clipfrac"] is not None]
        dis = [got[s]["disagreement_share"] for s in done if got[s]["disagreement_share"] is not None]
        diff = "—" if arm == "vanilla" or not paired else paired_difference(
            [base[s]["acc_last"] for s in paired], [got[s]["acc_last"] for s in paired]).format(3)
        cells = [arm, str(len(done)), str(sum(got[s]["failed"] for s in done)),
                 "—" if arm == "vanilla" else f"{fixed} / {broke} (p = {tb.sign_test(fixed, broke):.3f})",
                 ", ".join(str(got[s]["onset"]) if got[s]["failed"] else "—" for s in done),
                 mean_interval([got[s]["acc_last"] for s in done]).format(3).lstrip("+"), diff,
                 f"{statistics.fmean(clip):.4f}" if clip else "—", f"{statistics.fmean(dis):.3f}" if dis else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", required=True, help=f"known: {list(SETTINGS)}")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated; known: {list(ARMS)}")
    ap.add_argument("--seeds", type=int, default=SEEDS, help="seeds 1..N")
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "offpolicy")
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--assets", type=Path, default=None, help="the planted assets (planted_token.default_dir())")
    ap.add_argument("--smoke", action="store_true", help="3 steps, 32 validation rows (plumbing; kept apart)")
    ap.add_argument("--dry", action="store_true", help="print the commands and exit")
    ap.add_argument("--report", action="store_true", help="the tables of the kept runs only")
    ap.add_argument("--rerun", default=None, metavar="ARM:SEED",
                    help="run a kept run again (under OUT/rerun) and count the kept values that differ")
    a = ap.parse_args(argv)
    if a.setting not in SETTINGS:
        ap.error(f"--setting {a.setting!r}: unknown; known: {list(SETTINGS)}")
    arms = [x.strip() for x in a.arms.split(",") if x.strip()]
    if unknown := [x for x in arms if x not in ARMS]:
        ap.error(f"--arms: unknown arm(s) {unknown}; known: {list(ARMS)}")
    arms = ["vanilla", *[x for x in arms if x != "vanilla"]] if "vanilla" in arms else arms  # the baseline first
    setting, seeds, cpu = SETTINGS[a.setting], list(range(1, a.seeds + 1)), tb.cpu_type()
    steps = 3 if a.smoke else setting.steps
    out, store = a.out.resolve(), store_dir(a.store.resolve(), setting, a.smoke)
    assets = None
    if setting.planted:
        import planted_token

        assets = (a.assets or planted_token.default_dir()).expanduser().resolve()
        if not a.dry:
            planted_token.build(assets, log=lambda s: print(s, file=sys.stderr, flush=True))
    base = out / (setting.name + ("_smoke" if a.smoke else ""))
    plan = [(arm, s, base / f"seed{s}" / arm) for arm in arms for s in seeds]
    if a.rerun:
        arm, _, seed = a.rerun.partition(":")
        if arm not in ARMS or not seed.isdigit() or load_kept(store / f"{arm}_seed{seed}.json", cpu, steps) is None:
            raise SystemExit(f"--rerun {a.rerun}: no kept run of that arm and seed on this CPU type ({cpu}) in {store}")
        plan = [(arm, int(seed), base / "rerun" / f"seed{seed}" / arm)]
    if a.dry:
        for arm, s, run_dir in plan:
            env, cmd = run_command(setting, arm, s, run_dir, smoke=a.smoke, assets=assets)
            print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(cmd))
        return 0
    t0 = time.time()
    for k, (arm, s, run_dir) in enumerate(plan, 1):
        path = store / f"{arm}_seed{s}.json"
        if a.report or (not a.rerun and load_kept(path, cpu, steps) is not None):
            continue
        if a.rerun:
            shutil.rmtree(run_dir, ignore_errors=True)
            (run_dir.parent / f"{run_dir.name}.console.log").unlink(missing_ok=True)
        env, cmd = run_command(setting, arm, s, run_dir, smoke=a.smoke, assets=assets)
        print(f"[offpolicy] {k}/{len(plan)} {setting.name} {arm} seed {s} ({time.time() - t0:.0f} s so far)",
              flush=True)
        started = time.time()
        rc = pc.run_logged(cmd, env, run_dir)
        wall = time.time() - started
        print(f"[offpolicy] {arm} seed {s}: exit {rc} in {wall:.0f} s", flush=True)
        if not pc.run_done(run_dir, steps):
            print(f"[offpolicy] {arm} seed {s} did not finish; see {run_dir}/train.log", flush=True)
            continue
        metrics = pc.read_metrics(run_dir / "metrics.jsonl")
        if a.rerun:
            kept = load_kept(path, cpu, steps)
            differing, compared = tb.differing_values(kept["metrics"], metrics)
            same = tb.metrics_digest(metrics) == kept["digest"]
            print(f"[offpolicy] rerun of {arm} seed {s}: {differing} of {compared} kept values differ; every metric "
                  f"{'identical' if same else 'NOT identical'} (digest)", flush=True)
            return 0 if same and not differing else 1
        extra = None
        if setting.planted:
            import planted_token

            extra = planted_token.measure_run(run_dir, assets)
        gens = sorted((run_dir / "val_generations").glob("*.jsonl"), key=lambda p: int(p.stem))
        extra = {**(extra or {}), "wall_s": round(wall), "val_se": {p.stem: validation_se(p) for p in gens}} \
            if gens else extra
        keep_run(path, setting, arm, s, steps, metrics, cpu, extra)
    rows: dict[str, dict[int, dict]] = {}
    for arm, s, _ in plan:
        kept = load_kept(store / f"{arm}_seed{s}.json", cpu, steps)
        if kept is not None:
            rows.setdefault(arm, {})[s] = run_row(kept)
    text = "\n".join([f"# {setting.name} ({setting.about}; {MINI_BATCH_PROMPTS} prompts a mini-batch, "
                      f"{steps} steps{', smoke' if a.smoke else ''})", "", table(rows, arms, seeds), "",
                      f"CPU: {cpu}. Command: `python benchmarks/offpolicy_testbed.py {shlex.join(sys.argv[1:])}`"])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
