"""Benchmark: the lean testbed, the second testbed's recipe as one plain GRPO loop in one process.

The verl-path testbed (``benchmarks/offpolicy_testbed.py``) runs the tiny recipe through verl's trainer, a Ray
cluster and the CPU rollout server: about 7.7 machine-seconds a step and 9 minutes a mean@4 validation, 63
machine-minutes a 150-step run. This module runs the same recipe in one process from the same parts:

* **prompts**: the rows of step k as verl's sampler draws them (``data.seed`` = the run's seed;
  :func:`tiny_policy.step_rows`);
* **samples**: ``rollout.n`` = 8 a prompt at T = 1 from the CPU rollout server's own sampler class, each request
  seeded by :func:`stapo_verl.core.seeding.rollout_request_seed` (seed, step, validate, row, sample number), the seed
  ``rollout.full_determinism`` gives it (:func:`tiny_policy.sample_batch`);
* **rewards** from the project's scorer, **advantages** from verl's ``compute_grpo_outcome_advantage``;
* **old-policy statistics** (log p, entropy) from one forward of the policy that sampled (:func:`tiny_policy.
  add_statistics`); ``actor/entropy`` is their token mean by verl's ``agg_loss``, as verl's old-log-prob pass logs it;
* **the update**: 4 optimizer mini-batches of 4 prompts x 8 samples, one epoch; per mini-batch the arm's token mask
  from ``stapo_verl``'s registered mask code (:func:`stapo_verl.core.registry.get_policy_token_mask`, the function
  the plugin's pre-pass calls), then the policy-gradient term exactly as ``stapo_verl.core.losses.ppo_loss`` builds
  it (the kept tokens only, the token-mean denominator their count, verl's loss function from
  ``get_policy_loss_fn``), verl's AdamW (``build_optimizer``: lr, weight decay 0.1, betas 0.9/0.999, constant lr, no
  warm-up), gradient clipping at 1.0, a step skipped when the gradient norm is not finite (as verl's FSDP engine
  does); ``actor/stapo/lm_head_grad_norm`` is the pre-clip norm of the LM head's gradient, as the plugin reads it;
* **validation** every :data:`VAL_FREQ` steps and before training: all 640 validation rows x 4 seeded samples at
  T = 1, the mean@4 accuracy (the key verl logs) and its sampling error, and nothing the criterion does not read
  (verl 0.9.1 spends 3 minutes of each validation bootstrapping best/worst/majority metrics);
* **the registered criterion**: :func:`offpolicy_testbed.verdict` on the same keys;
* in the planted settings, p(J) on 128 fixed validation prefixes every :data:`PJ_FREQ` steps
  (:func:`planted_token.j_probability`; :func:`planted_v2.j_probability` for planted_v2) and the mask against J counted in process (every silenced token, every J
  sampled, the J's in correct responses of mixed groups).

Every random draw is a function of (seed, purpose, step, ...): rollout requests of (seed, step, validate, row,
sample), the random mask of (seed, step, mini-batch) (:func:`stapo_verl.algo.selections.mask_seed`, with
``random_mask_seed`` = the run's seed), and nothing else draws. One torch thread, so a run gives the same values on
the same CPU type whatever the load (``--rerun`` counts the values that differ).

Results: one JSON file a run, ``benchmarks/results/lean/<setting>/<arm>_seed<s>.json`` (every step's metrics, the
digest of them, the CPU type with its AVX-512 flags, the planted measurements, the wall time). ``--order`` runs the
registered order (:func:`run_order`) and skips every run whose file exists, so the same command on any later
machine continues where the last stopped; two processes started with the same command take different runs (a claim
file under ``--out``); with ``--commit`` each result file is committed as its run ends.

Usage::

    python benchmarks/lean_testbed.py --setting planted_v2_mb4_lr2e-4 --arms vanilla --seeds 1,2   # the pilot
    python benchmarks/lean_testbed.py --order --commit          # the registered grid, resumable (run it twice at once)
    python benchmarks/lean_testbed.py --order --plan            # what is done, what is left, machine-hours left
    python benchmarks/lean_testbed.py --setting S --rerun vanilla:1   # 0 differing values?
    python benchmarks/lean_testbed.py --report --setting S      # the tables of the finished runs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instability_testbed as tb  # noqa: E402  (digest, CPU type, differing values)
import offpolicy_testbed as ot  # noqa: E402  (the registered criterion, its keys, the tables)
import paired_comparison as pc  # noqa: E402
import tiny_policy as tp  # noqa: E402

REPO = pc.REPO
STORE = REPO / "benchmarks" / "results" / "lean"
#: prompts per optimizer mini-batch (16 prompts a step in 4 mini-batches, the paper's 4)
MINI_BATCH_PROMPTS = ot.MINI_BATCH_PROMPTS
VAL_N, VAL_FREQ, VAL_KEY = ot.VAL_N, ot.VAL_FREQ, ot.VAL_KEY
#: p(J) on fixed prefixes every PJ_FREQ steps (the verl-path testbed's checkpoint interval)
PJ_FREQ = ot.CKPT_FREQ
#: fixed validation prefixes of p(J)
PJ_PROMPTS = 128
#: CPU-minutes of one run per 100 steps, validation included (:func:`remaining_hours`): measured 178 and 186 CPU-s for
#: the 40-step gate runs (3 validations, 5 p(J) points) on an AMD EPYC, i.e. about 3.2 CPU-s a step and 20 CPU-s a
#: validation, so 11 CPU-minutes a 150-step planted run and 7.3 a 100-step control run
MINUTES_PER_100_STEPS = 7.5


@dataclass(frozen=True)
class Setting:
    """A lean setting: learning rate, steps, and which assets (``standard``: the tiny assets; ``planted``: the first
    planted warm start, ``benchmarks/planted_token.py``; ``planted_v2``: ``benchmarks/planted_v2.py``)."""

    name: str
    lr: float
    steps: int
    assets: str
    about: str = ""


SETTINGS = MappingProxyType({s.name: s for s in (
    Setting("mb4_lr5e-5", 5e-5, 100, "standard", "the stable control: lr 5e-5"),
    Setting("planted_mb4_lr2e-4", 2e-4, 150, "planted", "the first planted token (the parity gate's setting)"),
    Setting("planted_v2_mb4_lr2e-4", 2e-4, 150, "planted_v2", "planted_v2: a J rewarded before it harms"),
)})


@dataclass(frozen=True)
class Arm:
    """An arm: the registered ``token_mask`` it runs (keep-all for vanilla: ``top_entropy`` at ρ 1, as the
    verl-path testbed's vanilla does), its S2T keys, and where its mask reads p and H (``old_policy`` or
    ``current_minibatch``)."""

    name: str
    token_mask: str
    tau_p: float = tp.TINY["tau_p"]
    q: float = tp.TINY["entropy_quantile"]
    top_entropy_ratio: float = 0.2
    stats_source: str = "old_policy"


ARMS = MappingProxyType({a.name: a for a in (
    Arm("vanilla", "top_entropy", top_entropy_ratio=1.0),
    Arm("stapo", "s2t"),
    Arm("stapo_paper_tau", "s2t", tau_p=0.002),
    Arm("s2t_random", "s2t_random"),
    Arm("top_entropy", "top_entropy", top_entropy_ratio=0.2),
    Arm("stapo_current", "s2t", stats_source="current_minibatch"),
)})
#: the arms whose silenced tokens are S2T candidates (the mask's precision and recall against J are read there)
S2T_ARMS = ("stapo", "stapo_paper_tau", "s2t_random", "stapo_current")


def actor_config(setting: Setting, arm: Arm, seed: int):
    """verl's FSDP ``ActorConfig`` of one run: the tiny recipe's loss and optimizer (:data:`tiny_policy.TINY`),
    ``setting``'s lr, and the plugin's policy-loss config with ``arm``'s mask keys (``random_mask_seed`` = seed)."""
    from verl.workers.config import FSDPActorConfig
    from verl.workers.config.optimizer import FSDPOptimizerConfig

    from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig

    pl = StapoPolicyLossConfig(loss_mode="vanilla", token_mask=arm.token_mask, s2t_tau_p=arm.tau_p,
                               s2t_entropy_quantile=arm.q, top_entropy_ratio=arm.top_entropy_ratio,
                               random_mask_seed=seed, stats_source=arm.stats_source)
    return FSDPActorConfig(
        strategy="fsdp2", ppo_mini_batch_size=MINI_BATCH_PROMPTS, use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=672, clip_ratio_low=tp.TINY["clip_ratio_low"],
        clip_ratio_high=tp.TINY["clip_ratio_high"], clip_ratio_c=tp.TINY["clip_ratio_c"], loss_agg_mode="token-mean",
        optim=FSDPOptimizerConfig(lr=setting.lr, weight_decay=tp.TINY["weight_decay"],
                                  clip_grad=tp.TINY["clip_grad"]),
        policy_loss=pl, rollout_n=tp.TINY["rollout_n"], entropy_coeff=0.0, use_kl_loss=False)


def assets_dir(kind: str, log=print) -> Path:
    """The assets of ``kind`` (:class:`Setting`), built once and cached (each builder's default directory)."""
    if kind == "standard":
        from stapo_verl.cpu import make_assets as ma

        out = ma.default_dir()
        ma.build(out, log=log)
        return out
    if kind == "planted":
        import planted_token

        out = planted_token.default_dir()
        planted_token.build(out, log=log)
        return out
    if kind == "planted_v2":
        import planted_v2

        out = planted_v2.default_dir()
        planted_v2.build(out, log=log)
        return out
    raise ValueError(f"unknown assets kind {kind!r}")


# ----------------------------------------------------------------------------- one mini-batch
def token_mask(config, fields: dict, *, step: int, mini_batch: int):
    """``(keep (B, T) bool, metrics)``: the arm's registered mask (``config.policy_loss.token_mask``) on one
    optimizer mini-batch, as the plugin's pre-pass calls it (one process, no DP group). ``fields``: the padded
    ``old_log_probs``, ``entropy``, ``advantages``, ``response_mask``."""
    from stapo_verl.core.registry import get_policy_token_mask
    import stapo_verl.core.masks  # noqa: F401  (registers the masks)

    fn, required = get_policy_token_mask(config.policy_loss.token_mask)
    batch = {**fields, "global_steps": step, "mini_batch_index": mini_batch}
    keep, metrics = fn({k: batch[k] for k in required}, config, None)
    return keep.bool() & fields["response_mask"].bool(), metrics


def pg_loss(config, log_prob, old_log_prob, advantages, response_mask, keep):
    """The policy-gradient term of one optimizer mini-batch in one process, as ``stapo_verl.core.losses.ppo_loss``
    builds it: verl's loss function (``get_policy_loss_fn(loss_mode)``) over the kept tokens only (the other
    positions zeroed), the token-mean denominator Σ keep (at least 1). Returns ``(loss, verl's pg metrics)``."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    pg_mask = response_mask.bool() & keep.bool()
    old, lp, adv = (torch.where(pg_mask, x, 0.0) for x in (old_log_prob, log_prob, advantages))
    config.global_batch_info.clear()
    config.global_batch_info.update(dp_size=1, batch_num_tokens=max(int(pg_mask.sum()), 1),
                                    global_batch_size=int(response_mask.shape[0]),
                                    loss_scale_factor=config.loss_scale_factor)
    fn = get_policy_loss_fn(config.policy_loss.get("loss_mode", "vanilla"))
    return fn(old_log_prob=old, log_prob=lp, advantages=adv, response_mask=pg_mask,
              loss_agg_mode=config.loss_agg_mode, config=config, rollout_is_weights=None)


def _lm_head(model):
    """The LM head's weight (the tied embedding where the head is tied)."""
    return model.get_output_embeddings().weight


def update(model, optimizer, batch: tp.Batch, config, *, step: int) -> tuple[dict, torch.Tensor]:
    """The RL step's update: :data:`MINI_BATCH_PROMPTS` x n rows a mini-batch, in order, one AdamW step each
    (module docstring). Returns ``(metrics, silenced (B, T) bool)``: verl's pg metrics, the mask's metrics (and
    ``actor/stapo/mask_disagreement`` for ``current_minibatch``) and the LM-head norm, each the mean over the
    mini-batches (verl's reduction); ``silenced``: valid tokens the mask kept out."""
    from verl.utils.torch_functional import entropy_from_logits

    rows = MINI_BATCH_PROMPTS * tp.TINY["rollout_n"]
    silenced = torch.zeros_like(batch.response_mask)
    per: dict[str, list[float]] = {}
    model.train()
    for k, start in enumerate(range(0, len(batch.response_mask), rows)):
        sub = tp.Batch(**{key: (v[start:start + rows] if v is not None else None) for key, v in vars(batch).items()})
        logits = tp.response_logits(model, sub)
        log_prob = tp.response_log_prob(logits, sub)
        fields = {"old_log_probs": sub.log_prob, "entropy": sub.entropy, "advantages": sub.advantages,
                  "response_mask": sub.response_mask}
        metrics: dict[str, float] = {}
        if config.policy_loss.stats_source == "current_minibatch":
            with torch.no_grad():
                cur = {**fields, "old_log_probs": torch.where(sub.response_mask, log_prob.detach(), 0.0),
                       "entropy": torch.where(sub.response_mask, entropy_from_logits(logits.detach().float()), 0.0)}
            keep, metrics = token_mask(config, cur, step=step, mini_batch=k)
            keep_old, _ = token_mask(config, fields, step=step, mini_batch=k)
            metrics["actor/stapo/mask_disagreement"] = float((keep != keep_old)[sub.response_mask].sum())
        else:
            keep, metrics = token_mask(config, fields, step=step, mini_batch=k)
        silenced[start:start + rows] = sub.response_mask & ~keep
        loss, pg_metrics = pg_loss(config, log_prob, sub.log_prob, sub.advantages, sub.response_mask, keep)
        optimizer.zero_grad()
        loss.backward()
        head = _lm_head(model).grad
        lm_norm = float(head.detach().norm()) if head is not None else math.nan
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.clip_grad))
        if math.isfinite(grad_norm):
            optimizer.step()
        else:  # verl's FSDP engine skips the step
            optimizer.zero_grad()
            lm_norm = math.nan
        for key, value in {**pg_metrics, **metrics, pc.LM_HEAD_KEY: lm_norm, "actor/grad_norm": grad_norm,
                           "actor/pg_loss": float(loss.detach())}.items():
            per.setdefault(key, []).append(float(value))
    model.eval()
    return {key: statistics.fmean(v) for key, v in per.items()}, silenced


# ----------------------------------------------------------------------------- validation, J
def validate(policy: tp.Policy, rows: list[dict], *, seed: int, step: int) -> dict:
    """mean@:data:`VAL_N` accuracy over ``rows`` (seeded samples at T = 1; request seeds of (seed, step, validate))
    and its sampling error (``offpolicy_testbed.validation_se``'s formula). Returns ``{"acc", "se"}``."""
    batch = tp.sample_batch(policy, rows, n=VAL_N, rollout_seed=seed, global_step=step, validate=True)
    correct = (batch.scores > 0).double().view(len(rows), VAL_N)
    var = correct.var(dim=1, unbiased=True) / VAL_N
    return {"acc": float(correct.mean(dim=1).mean()), "se": float(var.sum().sqrt() / len(rows))}


def j_counts(batch: tp.Batch, silenced: torch.Tensor, j_id: int) -> dict:
    """The step's J's: sampled, in correct responses of groups with a wrong response (a positive advantage), of
    those silenced, the silenced tokens that are J, and the responses with one J and their accuracy inputs."""
    is_j = batch.response_mask & (batch.responses == j_id)
    correct = batch.scores > 0
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(batch.uid):
        groups.setdefault(u, []).append(i)
    mixed = torch.zeros_like(correct)
    for idx in groups.values():
        if not bool(correct[idx].all()) and bool(correct[idx].any()):
            mixed[idx] = True
    positive = is_j & (correct & mixed)[:, None]
    per = is_j.sum(-1)
    return {"j_sampled": int(is_j.sum()), "j_positive": int(positive.sum()),
            "j_positive_silenced": int((positive & silenced).sum()), "silenced": int(silenced.sum()),
            "silenced_j": int((is_j & silenced).sum()), "responses_with_j": int((per > 0).sum()),
            "correct_with_j": int((correct & (per > 0)).sum())}


def fixed_prefixes(policy: tp.Policy) -> list[dict]:
    """The :data:`PJ_PROMPTS` fixed validation prefixes of p(J) (``planted_token.j_probability``'s problems)."""
    return [{"question": r["prompt"][0]["content"], "solution": r["extra_info"]["solution"],
             "answer": r["reward_model"]["ground_truth"]}
            for r in tp.read_rows(policy.manifest["val_file"])[:PJ_PROMPTS]]


# ----------------------------------------------------------------------------- one run
def run(setting: Setting, arm: Arm, seed: int, assets: Path, *, steps: int | None = None, validate_every=VAL_FREQ,
        val_rows: int | None = None, partial: Path | None = None, log=print) -> dict:
    """One run (module docstring); returns its record (``metrics`` keyed by int step, ``planted``, ``wall_s``).

    ``steps``, ``validate_every``, ``val_rows``: shorten it (timing and tests; a registered run uses the setting's).
    ``partial``: where to write the record so far at every validation point (an unfinished run's interim record,
    ``"finished": false``; not a result).
    """
    import planted_token
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.workers.config.optimizer import build_optimizer

    torch.set_num_threads(1)
    t0, c0 = time.time(), time.process_time()
    steps = setting.steps if steps is None else steps
    config = actor_config(setting, arm, seed)
    policy = tp.load_policy(assets)
    optimizer = build_optimizer(list(policy.model.parameters()), config.optim)
    train_rows = tp.read_rows(policy.manifest["train_file"])
    val = tp.read_rows(policy.manifest["val_file"])[:val_rows]
    planted = "planted" in policy.manifest
    j_id = int(policy.manifest["planted"]["j_id"]) if planted else None
    prefixes = fixed_prefixes(policy) if planted else None
    if planted and str(policy.manifest["planted"].get("design", "")).startswith("v2"):
        import planted_v2

        measure_j = planted_v2.j_probability  # one slot, J-runs
    else:
        measure_j = planted_token.j_probability
    metrics: dict[int, dict] = {}
    p_j: dict[int, dict] = {}

    def record(finished: bool) -> dict:
        rec = {"setting": setting.name, "arm": arm.name, "seed": seed, "steps": steps, "cpu": tb.cpu_type(),
               "digest": tb.metrics_digest(metrics), "metrics": metrics, "wall_s": round(time.time() - t0, 1),
               "cpu_s": round(time.process_time() - c0, 1), "finished": finished,
               "assets": {"kind": setting.assets, "version": policy.manifest.get("version"),
                          "design": policy.manifest.get("planted", {}).get("design")}}
        if planted:
            rec["planted"] = {"p_j": p_j, "mask": mask_summary(metrics)}
        return rec

    def checkpoint(step: int) -> None:
        validated = bool(validate_every and (step % validate_every == 0 or step == steps))
        if validated:
            v = validate(policy, val, seed=seed, step=step)
            metrics.setdefault(step, {}).update({VAL_KEY: v["acc"], "val/se": v["se"]})
        if planted and (step % PJ_FREQ == 0 or step == steps):
            p_j[step] = measure_j(policy.model, policy.tokenizer, prefixes)
        if partial is not None and (validated or step % PJ_FREQ == 0) and step < steps:
            write_record(partial, record(False))

    checkpoint(0)
    for step in range(1, steps + 1):
        rows = tp.step_rows(train_rows, data_seed=seed, step=step, batch_size=tp.TINY["train_batch_size"])
        batch = tp.sample_batch(policy, rows, n=tp.TINY["rollout_n"], rollout_seed=seed, global_step=step,
                                validate=False)
        tp.add_statistics(policy, batch)
        batch.advantages = tp.grpo_advantages(batch)
        m = {"critic/score/mean": float(batch.scores.mean()),
             pc.ENTROPY_KEY: float(agg_loss(batch.entropy, batch.response_mask.float(), "token-mean")),
             "response_length/mean": float(batch.response_mask.sum(-1).float().mean())}
        upd, silenced = update(policy.model, optimizer, batch, config, step=step)
        m.update(upd)
        if planted:
            m.update({f"planted/{k}": v for k, v in j_counts(batch, silenced, j_id).items()})
        metrics.setdefault(step, {}).update(m)
        checkpoint(step)
        if step % 10 == 0 or step == steps:
            acc = metrics[step].get(VAL_KEY)
            log(f"[lean] {setting.name} {arm.name} seed {seed}: step {step}/{steps}, score {m['critic/score/mean']:+.3f}"
                f", entropy {m[pc.ENTROPY_KEY]:.4f}" + (f", val {acc:.4f}" if acc is not None else "")
                + (f", p(J) clean {p_j[step]['p_j_clean']:.2e}" if step in p_j else "")
                + f" ({time.time() - t0:.0f} s)")
    return record(True)


def mask_summary(metrics: dict[int, dict]) -> dict:
    """The run's mask against J: precision (silenced J's / silenced tokens), recall (silenced J's among the J's
    with a positive advantage / those J's), and the sums they come from; None where a denominator is 0."""
    tot = {k: sum(int(m.get(f"planted/{k}", 0)) for m in metrics.values())
           for k in ("silenced", "silenced_j", "j_positive", "j_positive_silenced", "j_sampled")}
    return {**tot, "precision": tot["silenced_j"] / tot["silenced"] if tot["silenced"] else None,
            "recall": tot["j_positive_silenced"] / tot["j_positive"] if tot["j_positive"] else None}


# ----------------------------------------------------------------------------- files, order, claims
def result_path(store: Path, setting: str, arm: str, seed: int) -> Path:
    """Where a finished run's record lives."""
    return Path(store) / setting / f"{arm}_seed{seed}.json"


def write_record(path: Path, record: dict) -> None:
    """Write a record (JSON, sorted keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=0, sort_keys=True) + "\n")


def read_record(path: Path) -> dict:
    """A record with ``metrics`` (and ``planted.p_j``) keyed by int step."""
    record = json.loads(Path(path).read_text())
    record["metrics"] = {int(s): m for s, m in record["metrics"].items()}
    if "planted" in record:
        record["planted"]["p_j"] = {int(s): v for s, v in record["planted"]["p_j"].items()}
    return record


#: the registered run order (docs/results.md, the amendment): (setting, arm, seed), first to last
GRID_ARMS = ("vanilla", "stapo", "stapo_paper_tau", "s2t_random", "top_entropy", "stapo_current")


def run_order(seeds: int = 5) -> list[tuple[str, str, int]]:
    """The registered order: the pilot (planted_v2 vanilla seeds 1-2); the stable control (vanilla seeds 1-5); then
    planted_v2 seed by seed, each seed's six arms in :data:`GRID_ARMS` order (finished pairs come early)."""
    order = [("planted_v2_mb4_lr2e-4", "vanilla", s) for s in (1, 2)]
    order += [("mb4_lr5e-5", "vanilla", s) for s in range(1, seeds + 1)]
    for s in range(1, seeds + 1):
        order += [("planted_v2_mb4_lr2e-4", a, s) for a in GRID_ARMS]
    seen, out = set(), []
    for item in order:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def claim(out: Path, item: tuple[str, str, int]) -> bool:
    """Take ``item`` for this process (an exclusive claim file under ``out``); False when another holds it."""
    path = Path(out) / "claims" / f"{item[0]}.{item[1]}.{item[2]}.claim"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def remaining_hours(store: Path, order: list[tuple[str, str, int]]) -> tuple[list, float]:
    """``(runs without a result file, CPU-hours they need)`` at :data:`MINUTES_PER_100_STEPS` (one run a core, so
    half that in wall hours on 2 idle cores)."""
    left = [x for x in order if not result_path(store, *x).exists()]
    return left, sum(SETTINGS[s].steps for s, _, _ in left) / 100 * MINUTES_PER_100_STEPS / 60


def commit(path: Path, message: str, tries: int = 10) -> bool:
    """``git add path && git commit -m message`` in the repository, retried while another commit holds the index."""
    for k in range(tries):
        add = subprocess.run(["git", "-C", str(REPO), "add", str(path)], capture_output=True, text=True)
        done = add.returncode == 0 and subprocess.run(
            ["git", "-C", str(REPO), "commit", "-m", message, "--", str(path)], capture_output=True,
            text=True).returncode == 0
        if done:
            return True
        time.sleep(3 + 2 * k)
    return False


def row_of(record: dict) -> dict:
    """One run's line of the tables (:func:`offpolicy_testbed.run_row`) plus p(J) at the start and the end and
    the mask's precision and recall against J."""
    row = ot.run_row(record)
    pl = record.get("planted")
    if pl:
        steps = sorted(pl["p_j"])
        row.update(p_j0=pl["p_j"][steps[0]]["p_j_clean"], p_j_last=pl["p_j"][steps[-1]]["p_j_clean"],
                   precision=pl["mask"]["precision"], recall=pl["mask"]["recall"])
    return row


#: the paired measures of :func:`paired_table`: (column, the run's value from its :func:`row_of` and record)
PAIRED = (
    ("failed (0/1)", lambda r, rec: float(r["failed"])),
    ("onset (no failure: the run's steps)", lambda r, rec: float(r["onset"] if r["failed"] else rec["steps"])),
    ("final mean@4", lambda r, rec: r["acc_last"]),
    ("entropy, mean of the last 50 steps", lambda r, rec: statistics.fmean(
        float(m["actor/entropy"]) for s, m in rec["metrics"].items() if int(s) > rec["steps"] - 50)),
    ("log10 p(J) at the clean slot, last", lambda r, rec: math.log10(r["p_j_last"])),
)


def paired_table(records: dict[str, dict[int, dict]], arms: list[str]) -> str:
    """Markdown: per arm and measure of :data:`PAIRED`, the mean paired difference arm − ``vanilla`` over the seeds
    both ran, with its 95 % t interval; then the mask's precision and recall against J (mean and interval over
    seeds, where defined). ``records[arm][seed]``: a kept record."""
    from stapo_verl.diagnostics.paired import mean_interval, paired_difference

    base = records["vanilla"]
    head = ["arm", "seeds", *(name for name, _ in PAIRED), "precision vs J", "recall vs J"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in arms:
        got = records.get(arm, {})
        seeds = sorted(set(got) & set(base))
        if arm == "vanilla" or not seeds:
            continue
        cells = [arm, str(len(seeds))]
        for _, value in PAIRED:
            cells.append(paired_difference([value(row_of(base[s]), base[s]) for s in seeds],
                                           [value(row_of(got[s]), got[s]) for s in seeds]).format(3))
        for key in ("precision", "recall"):
            xs = [got[s]["planted"]["mask"][key] for s in seeds if got[s]["planted"]["mask"][key] is not None]
            cells.append(mean_interval(xs).format(3).lstrip("+") + f" (n = {len(xs)})" if len(xs) > 1 else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


INTERIM = REPO / "benchmarks" / "results" / "offpolicy" / "planted_mb4_lr2e-4_interim"


def verl_interim(arm: str, interim: Path = INTERIM) -> dict:
    """The verl-path seed-1 run of ``arm`` to step 40 (interim records): ``{"val": {step: acc}, "p_j": {step: p},
    "metrics": {step: {key: value}}}``."""
    metrics = {}
    for line in (interim / f"{arm}_seed1.steps0-40.metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            metrics.setdefault(int(row["step"]), {}).update(row["data"])
    pj = json.loads((interim / f"{arm}_seed1.planted_measure.json").read_text())["p_j"]
    return {"val": {s: m[VAL_KEY] for s, m in metrics.items() if VAL_KEY in m},
            "p_j": {int(s): v["p_j_clean"] for s, v in pj.items()}, "metrics": metrics}


def gate(store: Path, arms=("vanilla", "stapo"), spread_seeds=(1, 2, 3), setting="planted_mb4_lr2e-4_steps40",
         interim: Path = INTERIM) -> dict:
    """The 40-step parity gate (docs/results.md, the amendment): per arm and point (validation at 0/20/40, p(J) at
    the clean slots at 10-40), the verl path's seed-1 value, the lean loop's seed-1 value, the lean ``vanilla`` seeds'
    range (``spread_seeds``) and whether the point passes: the verl value inside that range widened by 2 se of each
    side (validation), or |lean - verl| <= the range's width. Returns ``{arm: [row, ...]}``; rows
    ``{"what", "step", "verl", "lean", "lo", "hi", "se", "ok"}``."""
    spread = [read_record(result_path(store, setting, "vanilla", s)) for s in spread_seeds
              if result_path(store, setting, "vanilla", s).exists()]
    out = {}
    for arm in arms:
        path = result_path(store, setting, arm, 1)
        if not path.exists():
            continue
        lean, verl = read_record(path), verl_interim(arm, interim)
        rows = []
        for what, steps in (("val", (0, 20, 40)), ("p_j", (10, 20, 30, 40))):
            for step in steps:
                if what == "val":
                    lv = lean["metrics"][step][VAL_KEY]
                    se = lean["metrics"][step]["val/se"]
                    vals = [r["metrics"][step][VAL_KEY] for r in spread]
                else:
                    lv, se = lean["planted"]["p_j"][step]["p_j_clean"], 0.0
                    vals = [r["planted"]["p_j"][step]["p_j_clean"] for r in spread]
                vv = verl[what][step]
                lo, hi = min(vals), max(vals)
                ok = (lo - 2 * se * math.sqrt(2) <= vv <= hi + 2 * se * math.sqrt(2)) or abs(lv - vv) <= hi - lo
                rows.append({"what": what, "step": step, "verl": vv, "lean": lv, "lo": lo, "hi": hi, "se": se,
                             "ok": ok})
        out[arm] = rows
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--setting", default=None, help=f"known: {list(SETTINGS)}")
    ap.add_argument("--arms", default="vanilla", help=f"comma-separated; known: {list(ARMS)}")
    ap.add_argument("--seeds", default="1", help="comma-separated seeds")
    ap.add_argument("--order", action="store_true", help="the registered order (run_order), skipping finished runs")
    ap.add_argument("--plan", action="store_true", help="with --order: print what is left and its machine-hours")
    ap.add_argument("--store", type=Path, default=STORE)
    ap.add_argument("--out", type=Path, default=REPO / "outputs" / "lean", help="claims and logs")
    ap.add_argument("--commit", action="store_true", help="commit each result file as its run ends")
    ap.add_argument("--steps", type=int, default=None, help="shorter runs (written under --store/<setting>_steps<N>)")
    ap.add_argument("--rerun", default=None, metavar="ARM:SEED", help="run a finished run again, count differences")
    ap.add_argument("--report", action="store_true", help="the table of the finished runs of --setting")
    ap.add_argument("--gate", action="store_true", help="the 40-step parity gate against the verl path's interim pair")
    a = ap.parse_args(argv)
    if a.gate:
        for arm, rows in gate(a.store).items():
            for r in rows:
                print(f"{arm} {r['what']} step {r['step']}: verl {r['verl']:.4g}, lean {r['lean']:.4g}, lean vanilla "
                      f"seeds [{r['lo']:.4g}, {r['hi']:.4g}], se {r['se']:.3g}: {'pass' if r['ok'] else 'FAIL'}")
        return 0
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if a.order:
        order = run_order()
        if a.plan:
            left, hours = remaining_hours(a.store, order)
            print(f"{len(order) - len(left)} of {len(order)} runs done; left ({hours:.1f} CPU-hours at "
                  f"{MINUTES_PER_100_STEPS:g} CPU-min per 100 steps, one run a core):")
            for item in left:
                print("  " + " ".join(map(str, item)))
            return 0
        for item in order:
            path = result_path(a.store, *item)
            if path.exists() or not claim(a.out, item):
                continue
            setting, arm = SETTINGS[item[0]], ARMS[item[1]]
            record = run(setting, arm, item[2], assets_dir(setting.assets, log), log=log,
                         partial=result_path(a.out / "partial", *item))
            if path.exists():  # another machine's file arrived meanwhile: keep the first
                continue
            write_record(path, record)
            v = ot.verdict(record["metrics"])
            log(f"[lean] wrote {path} ({record['wall_s']:.0f} s; failed={v.failed}, onset {v.onset})")
            if a.commit and not commit(path, f"results: lean {item[0]} {item[1]} seed {item[2]} "
                                             f"({record['steps']} steps, {record['cpu']})"):
                log(f"[lean] could not commit {path}")
        return 0
    if a.setting not in SETTINGS:
        ap.error(f"--setting {a.setting!r}: unknown; known: {list(SETTINGS)}")
    setting = SETTINGS[a.setting]
    name = setting.name + (f"_steps{a.steps}" if a.steps else "")
    if a.rerun:
        arm, _, seed = a.rerun.partition(":")
        kept = read_record(result_path(a.store, name, arm, int(seed)))
        if kept["cpu"] != tb.cpu_type():
            log(f"[lean] the kept run was made on {kept['cpu']}, this is {tb.cpu_type()}: values may differ")
        record = run(setting, ARMS[arm], int(seed), assets_dir(setting.assets, log), steps=kept["steps"], log=log)
        differing, compared = tb.differing_values(kept["metrics"], record["metrics"])
        same = record["digest"] == kept["digest"]
        print(f"rerun of {name} {arm} seed {seed}: {differing} of {compared} values differ; digest "
              f"{'identical' if same else 'NOT identical'} ({record['wall_s']:.0f} s, {record['cpu']})")
        return 0 if same and not differing else 1
    arms = [x for x in a.arms.split(",") if x]
    seeds = [int(x) for x in a.seeds.split(",") if x]
    if a.report:
        rows: dict[str, dict[int, dict]] = {}
        for arm in arms:
            for s in seeds:
                path = result_path(a.store, name, arm, s)
                if path.exists():
                    rows.setdefault(arm, {})[s] = row_of(read_record(path))
        print(ot.table(rows, arms, seeds))
        if "vanilla" in rows and all("planted" in read_record(result_path(a.store, name, arm, s))
                                     for arm in rows for s in rows[arm]):
            records = {arm: {s: read_record(result_path(a.store, name, arm, s)) for s in rows[arm]} for arm in rows}
            print("\npaired differences, arm − vanilla (mean over seeds, 95 % t interval):\n"
                  + paired_table(records, arms))
        for arm in rows:
            for s, r in sorted(rows[arm].items()):
                print(f"{arm} seed {s}: failed {r['failed']} (onset {r['onset']}), acc {r['acc0']:.4f} → "
                      f"{r['acc_last']:.4f}, p(J) {r.get('p_j0', math.nan):.2e} → {r.get('p_j_last', math.nan):.2e},"
                      f" precision {r.get('precision')}, recall {r.get('recall')}")
        return 0
    for arm in arms:
        for s in seeds:
            path = result_path(a.store, name, arm, s)
            if path.exists():
                log(f"[lean] {path} exists: skipped")
                continue
            record = run(setting, ARMS[arm], s, assets_dir(setting.assets, log), steps=a.steps, log=log,
                         partial=result_path(a.out / "partial", name, arm, s))
            write_record(path, record)
            v = ot.verdict(record["metrics"])
            log(f"[lean] wrote {path} ({record['wall_s']:.0f} s; failed={v.failed}, onset {v.onset})")
            if a.commit:
                commit(path, f"results: lean {name} {arm} seed {s} ({record['steps']} steps, {record['cpu']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
