"""Benchmark: what S2T's silenced tokens do to one update, counterfactually, at checkpoints of a run.

Whatever the long runs show, this asks directly whether the tokens S2T silences drive a failure: at each checkpoint
of one vanilla run in the failing setting (``benchmarks/offpolicy_testbed.py`` saves one every 10 steps), take the
batch of the next step (its prompts, seeded samples, scorer and GRPO advantages, as the run draws them:
``benchmarks/tiny_policy.py``) and make, from the same weights and the same optimizer state, three updates:

* ``all`` -- every valid token (what vanilla did);
* ``without_s2t`` -- without the tokens the S2T mask silences (τ_p, q = 0.75; old-policy statistics; the PG
  token-mean renormalised over the kept tokens, as the plugin does);
* ``without_random`` -- without as many candidates (positive advantage, p < τ_p) drawn at random (seeded by
  :func:`stapo_verl.algo.selections.mask_seed` of the seed, step and mini-batch).

One update is the recipe's RL step: the batch split into its optimizer mini-batches (4 prompts x 8 samples each, in
order), one AdamW step each (verl's ``compute_policy_loss_vanilla``, token-mean, clip 0.2 / 0.28, dual clip 10,
gradient clip 1.0), the optimizer's moments, step count and learning rate loaded from the checkpoint
(``optim_world_size_1_rank_0.pt``), so the update is the one the run would have made. Measured against the
checkpoint on held-out validation prompts: the change of sampled accuracy (``--val-n`` seeded samples a prompt, the
same request seeds for every arm, so the arms are paired), of the mean entropy and the mean KL(checkpoint || updated)
over the checkpoint's own held-out responses (teacher-forced, so only the weights differ).

Usage::

    python benchmarks/counterfactual_update.py --run outputs/offpolicy/<setting>/seed1/vanilla --seed 1 \
        [--assets DIR] [--checkpoints 10,20,...] [--tau-p 0.1] [--val-prompts 256] [--val-n 4] [--out FILE.md]

One torch thread: the numbers depend on the seeds only, not on the machine's load.
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

#: prompts per optimizer mini-batch (the second testbed's recipe)
MINI_BATCH_PROMPTS = 4
ARMS = ("all", "without_s2t", "without_random")


def load_optimizer(model, actor_dir: Path, config):
    """verl's AdamW (``build_optimizer(config.optim)``) over ``model``'s parameters with the state of a verl FSDP
    checkpoint of world size 1 (``optim_world_size_1_rank_0.pt``: torch's optimizer state dict, parameters by index
    in ``model.parameters()`` order, moments as DTensors), learning rate included.

    Raises:
        FileNotFoundError: the file is missing. ValueError: the state does not fit the model's parameters.
    """
    from verl.workers.config.optimizer import build_optimizer

    path = Path(actor_dir) / "optim_world_size_1_rank_0.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing (a tiny run's optimizer checkpoint at world size 1)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    params = list(model.parameters())
    for i, s in state["state"].items():
        for k, v in list(s.items()):
            s[k] = v.to_local() if hasattr(v, "to_local") else v
        want = tuple(params[int(i)].shape) if int(i) < len(params) else None
        if tuple(s["exp_avg"].shape) != want:
            raise ValueError(f"{path}: state {i} does not fit parameter {i} of the model "
                             f"({tuple(s['exp_avg'].shape)} vs {want})")
    opt = build_optimizer(params, config.optim)
    opt.load_state_dict(state)
    return opt


def random_candidates(candidates: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """(B, T) bool: ``count`` of the True positions of ``candidates`` drawn uniformly without replacement by a
    generator seeded with ``seed``. Raises ValueError when ``count`` exceeds the candidates."""
    idx = candidates.flatten().nonzero().squeeze(-1)
    if count > len(idx):
        raise ValueError(f"count={count} exceeds the {len(idx)} candidates")
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(candidates.numel(), dtype=torch.bool)
    out[idx[torch.randperm(len(idx), generator=g)[:count]]] = True
    return out.view_as(candidates)


def masks(batch: tp.Batch, *, tau_p: float, q: float, seed: int, step: int) -> dict[str, torch.Tensor]:
    """The PG masks of the three arms (module docstring), each (B, T) bool, per optimizer mini-batch as the plugin
    takes them (the S2T population and its τ_h are the mini-batch's); ``_silenced``: S2T's silenced tokens."""
    from stapo_verl.algo.s2t import candidate_mask, s2t_keep_mask
    from stapo_verl.algo.selections import mask_seed

    valid = batch.response_mask
    keep_s2t, keep_rand = valid.clone(), valid.clone()
    rows = MINI_BATCH_PROMPTS * tp.TINY["rollout_n"]
    for k, start in enumerate(range(0, len(valid), rows)):
        sl = slice(start, start + rows)
        keep, _ = s2t_keep_mask(batch.log_prob[sl], batch.entropy[sl], batch.advantages[sl], valid[sl], tau_p=tau_p,
                                q=q)
        keep_s2t[sl] = keep
        cand, _ = candidate_mask(batch.log_prob[sl], batch.entropy[sl], batch.advantages[sl], valid[sl], tau_p)
        count = int((valid[sl] & ~keep).sum())
        keep_rand[sl] = valid[sl] & ~random_candidates(cand, count, mask_seed(seed, step, k))
    return {"all": valid, "without_s2t": keep_s2t, "without_random": keep_rand, "_silenced": valid & ~keep_s2t}


def one_update(model, optimizer_state: dict, batch: tp.Batch, keep: torch.Tensor, config):
    """A copy of ``model`` after the recipe's RL step on ``batch`` over ``keep`` (module docstring): one AdamW step
    per optimizer mini-batch, from ``optimizer_state`` (a torch optimizer state dict; π_old = ``batch.log_prob``)."""
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    from verl.workers.config.optimizer import build_optimizer

    m = copy.deepcopy(model)
    m.train()
    opt = build_optimizer(list(m.parameters()), config.optim)
    opt.load_state_dict(copy.deepcopy(optimizer_state))
    rows = MINI_BATCH_PROMPTS * tp.TINY["rollout_n"]
    for start in range(0, len(keep), rows):
        sub = tp.Batch(**{k: (v[start:start + rows] if v is not None else None) for k, v in vars(batch).items()})
        mask = keep[start:start + rows]
        if not bool(mask.any()):
            continue
        log_prob = tp.response_log_prob(tp.response_logits(m, sub), sub)
        config.global_batch_info.clear()  # one process: token-mean divides by the mini-batch's Σ mask
        loss, _ = compute_policy_loss_vanilla(sub.log_prob, log_prob, sub.advantages, mask.float(), "token-mean",
                                              config)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), config.optim.clip_grad)
        opt.step()
    m.eval()
    return m


@torch.no_grad()
def held_out_change(start, updated, held_out: tp.Batch) -> dict:
    """Mean entropy change and mean KL(start || updated) over ``held_out``'s response tokens (teacher-forced)."""
    from verl.utils.torch_functional import entropy_from_logits

    m = held_out.response_mask
    a = torch.log_softmax(tp.response_logits(start, held_out).float(), -1)
    b = torch.log_softmax(tp.response_logits(updated, held_out).float(), -1)
    kl = (a.exp() * (a - b)).sum(-1)
    dh = entropy_from_logits(b) - entropy_from_logits(a)
    return {"dH": float(dh[m].double().mean()), "kl": float(kl[m].double().mean())}


def main(argv=None) -> int:
    from bench_spurious_quadrants import actor_config

    from stapo_verl.diagnostics.paired import paired_difference

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a vanilla run with checkpoints (ckpt/global_step_<n>)")
    ap.add_argument("--seed", type=int, required=True, help="the run's seed (data.seed = rollout.seed = seed)")
    ap.add_argument("--assets", type=Path, default=Path(os.environ.get("STAPO_ASSETS") or
                                                        Path.home() / ".cache" / "stapo_verl" / "tiny"))
    ap.add_argument("--checkpoints", default=None, help="comma-separated steps (default: every checkpoint)")
    ap.add_argument("--tau-p", type=float, default=tp.TINY["tau_p"])
    ap.add_argument("--q", type=float, default=tp.TINY["entropy_quantile"])
    ap.add_argument("--lr", type=float, default=None, help="the run's lr, checked against the checkpoint's")
    ap.add_argument("--val-prompts", type=int, default=256)
    ap.add_argument("--val-n", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    ckpts = sorted(int(p.name.rsplit("_", 1)[-1]) for p in (a.run / "ckpt").glob("global_step_*"))
    if a.checkpoints:
        want = [int(x) for x in a.checkpoints.split(",")]
        if missing := [s for s in want if s not in ckpts]:
            raise SystemExit(f"--checkpoints: no checkpoint of step(s) {missing} in {a.run / 'ckpt'}; have {ckpts}")
        ckpts = want
    if not ckpts:
        raise SystemExit(f"--run {a.run}: no checkpoint (ckpt/global_step_<n>); run with trainer.save_freq set")
    config = actor_config()
    rows_all = None
    per = []
    for step in ckpts:
        actor = a.run / "ckpt" / f"global_step_{step}" / "actor"
        policy = tp.load_policy(a.assets, actor)
        opt = load_optimizer(policy.model, actor, config)
        if a.lr is not None and not math.isclose(opt.param_groups[0]["lr"], a.lr, rel_tol=1e-6):
            raise SystemExit(f"--lr {a.lr}: the checkpoint's optimizer has lr {opt.param_groups[0]['lr']}")
        state = opt.state_dict()
        rows_all = rows_all or tp.read_rows(policy.manifest["train_file"])
        batch = tp.sample_batch(policy, tp.step_rows(rows_all, data_seed=a.seed, step=step + 1,
                                                     batch_size=tp.TINY["train_batch_size"]),
                                n=tp.TINY["rollout_n"], rollout_seed=a.seed, global_step=step + 1, validate=False)
        tp.add_statistics(policy, batch)
        batch.advantages = tp.grpo_advantages(batch)
        mk = masks(batch, tau_p=a.tau_p, q=a.q, seed=a.seed, step=step + 1)
        val_rows = tp.read_rows(policy.manifest["val_file"])[:a.val_prompts]
        held = tp.sample_batch(policy, val_rows, n=1, rollout_seed=a.seed, global_step=step, validate=True)
        acc0 = float((tp.sample_batch(policy, val_rows, n=a.val_n, rollout_seed=a.seed, global_step=step + 1,
                                      validate=True).scores > 0).float().mean())
        row = {"step": step, "silenced": int(mk["_silenced"].sum()), "valid": int(batch.response_mask.sum()),
               "acc0": acc0}
        for arm in ARMS:
            updated = one_update(policy.model, state, batch, mk[arm], config)
            up = tp.Policy(updated, policy.tokenizer, policy.manifest, policy.vocab_size)
            acc = float((tp.sample_batch(up, val_rows, n=a.val_n, rollout_seed=a.seed, global_step=step + 1,
                                         validate=True).scores > 0).float().mean())
            row[arm] = {"dacc": acc - acc0, **held_out_change(policy.model, updated, held)}
        per.append(row)
        print(f"[counterfactual] step {step}: silenced {row['silenced']} of {row['valid']}; Δacc all "
              f"{row['all']['dacc']:+.4f}, without S2T {row['without_s2t']['dacc']:+.4f}, without random "
              f"{row['without_random']['dacc']:+.4f} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    lines = [f"Run: {a.run} (seed {a.seed}); τ_p {a.tau_p:g}, q {a.q:g}; held-out: {a.val_prompts} validation "
             f"prompts, accuracy from {a.val_n} seeded samples each (same seeds in every arm).", "",
             "| checkpoint | silenced / valid | acc | Δacc all / without S2T / without random | "
             "ΔH all / without S2T / without random | KL all / without S2T / without random |",
             "|---|---|---|---|---|---|"]
    for r in per:
        lines.append(f"| {r['step']} | {r['silenced']} / {r['valid']} | {r['acc0']:.3f} | "
                     + " / ".join(f"{r[x]['dacc']:+.4f}" for x in ARMS) + " | "
                     + " / ".join(f"{r[x]['dH']:+.5f}" for x in ARMS) + " | "
                     + " / ".join(f"{r[x]['kl']:.2e}" for x in ARMS) + " |")
    lines.append("")
    for other in ARMS[1:]:
        for key, digits in (("dacc", 4), ("dH", 5), ("kl", 6)):
            d = paired_difference([r[other][key] for r in per], [r["all"][key] for r in per])
            lines.append(f"- all − {other}, {key} (paired over {len(per)} checkpoints, 95 % t): {d.format(digits)}")
    lines += ["", f"({time.time() - t0:.0f} s, one thread)"]
    text = "\n".join(lines)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
