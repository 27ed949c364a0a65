"""The lean testbed's parity gate at step 1: one real batch through the lean loss path and the verl path's.

The verl-path testbed computes each optimizer mini-batch's loss in the plugin's worker: the pre-pass
``stapo_verl.core.losses.apply_policy_token_mask`` on verl's TensorDict, then ``stapo_verl.core.losses.ppo_loss``
on the engine's micro-batch (nested no-padding layout). The lean loop (``benchmarks/lean_testbed.py``) calls the
registered mask and verl's loss function directly on padded tensors. :func:`compare_step` feeds the same batch (the
policy's own seeded samples of one step, old-policy statistics, GRPO advantages) through both, mini-batch by
mini-batch from the same weights, and returns the largest differences of the loss, of every parameter's gradient and
of the keep mask.

Run ``python tests/support/lean_parity.py [--assets DIR] [--seed 1] [--step 1]`` for the numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
# run as a script, this folder is sys.path[0]; its tokenizers.py would shadow the tokenizers package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
for p in (ROOT / "benchmarks", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import lean_testbed as lt  # noqa: E402
import tiny_policy as tp  # noqa: E402


def step_batch(policy: tp.Policy, seed: int, step: int) -> tp.Batch:
    """The batch of ``step`` as a run of ``seed`` draws it from ``policy`` (statistics and advantages filled)."""
    rows = tp.step_rows(tp.read_rows(policy.manifest["train_file"]), data_seed=seed, step=step,
                        batch_size=tp.TINY["train_batch_size"])
    batch = tp.sample_batch(policy, rows, n=tp.TINY["rollout_n"], rollout_seed=seed, global_step=step,
                            validate=False)
    tp.add_statistics(policy, batch)
    batch.advantages = tp.grpo_advantages(batch)
    return batch


def _grads(model) -> list[torch.Tensor]:
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def compare_step(policy: tp.Policy, batch: tp.Batch, arm: str, *, seed: int, step: int,
                 setting: str = "planted_mb4_lr2e-4") -> dict:
    """Both loss paths on each optimizer mini-batch of ``batch`` at ``policy``'s weights (no optimizer step).

    Returns ``{"loss_max_abs", "loss_max_rel", "grad_max_abs", "grad_max_rel"`` (over the mini-batches; rel: the
    difference over the larger norm), ``"keep_differing"`` (tokens), ``"kept"``, ``"losses"`` (lean, verl) per
    mini-batch``}``.
    """
    from support.verl_batches import as_micro_batch, minibatch, model_output_for
    from verl.utils import tensordict_utils as tu

    from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask, ppo_loss

    config = lt.actor_config(lt.SETTINGS[setting], lt.ARMS[arm], seed)
    vconfig = lt.actor_config(lt.SETTINGS[setting], lt.ARMS[arm], seed)
    model = policy.model
    model.train()
    rows = lt.MINI_BATCH_PROMPTS * tp.TINY["rollout_n"]
    out = {"loss_max_abs": 0.0, "loss_max_rel": 0.0, "grad_max_abs": 0.0, "grad_max_rel": 0.0,
           "keep_differing": 0, "kept": 0, "losses": []}
    for k, start in enumerate(range(0, len(batch.response_mask), rows)):
        sub = tp.Batch(**{key: (v[start:start + rows] if v is not None else None) for key, v in vars(batch).items()})
        rm = sub.response_mask
        fields = {"old_log_probs": sub.log_prob, "entropy": sub.entropy, "advantages": sub.advantages,
                  "response_mask": rm}
        # lean
        model.zero_grad()
        log_prob = tp.response_log_prob(tp.response_logits(model, sub), sub)
        keep, _ = lt.token_mask(config, fields, step=step, mini_batch=k)
        loss, _ = lt.pg_loss(config, log_prob, sub.log_prob, sub.advantages, rm, keep)
        loss.backward()
        lean_grads = _grads(model)
        # the verl path: pre-pass on the TensorDict, then ppo_loss on the engine's micro-batch
        model.zero_grad()
        log_prob = tp.response_log_prob(tp.response_logits(model, sub), sub)
        b = minibatch(sub.log_prob.double(), sub.entropy.double(), sub.advantages.double(), rm,
                      logp=log_prob.detach().double())
        td = b["td"]
        for key in ("old_log_probs", "entropy", "advantages"):  # the statistics in the run's dtype (fp32)
            td[key] = td[key].float()
        tu.assign_non_tensor(td, global_steps=step, mini_batch_index=k)
        apply_policy_token_mask(vconfig, td)
        vkeep = td[POLICY_LOSS_MASK_KEY].to_padded_tensor(0).bool()
        width = vkeep.shape[1]
        mb = as_micro_batch(td, list(range(len(rm))), batch_num_tokens=int(rm.sum()), global_batch_size=len(rm))
        vloss, _ = ppo_loss(vconfig, model_output_for(mb, log_prob), mb)
        vloss.backward()
        verl_grads = _grads(model)
        out["keep_differing"] += int((keep[:, :width] != vkeep).sum()) + int(keep[:, width:].sum())
        out["kept"] += int(keep.sum())
        dl = abs(float(loss) - float(vloss))
        out["loss_max_abs"] = max(out["loss_max_abs"], dl)
        out["loss_max_rel"] = max(out["loss_max_rel"], dl / max(abs(float(loss)), abs(float(vloss)), 1e-30))
        for g1, g2 in zip(lean_grads, verl_grads):
            d = float((g1 - g2).abs().max())
            out["grad_max_abs"] = max(out["grad_max_abs"], d)
            out["grad_max_rel"] = max(out["grad_max_rel"],
                                      float((g1 - g2).norm()) / max(float(g1.norm()), float(g2.norm()), 1e-30))
        out["losses"].append((float(loss), float(vloss)))
    model.zero_grad()
    model.eval()
    return out


def main(argv=None) -> int:
    import argparse

    import planted_token

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", type=Path, default=planted_token.default_dir())
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--arms", default=",".join(lt.ARMS))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    policy = tp.load_policy(a.assets)
    batch = step_batch(policy, a.seed, a.step)
    print(f"step {a.step}, seed {a.seed}: {int(batch.response_mask.sum())} valid tokens, score mean "
          f"{float(batch.scores.mean()):+.4f}")
    for arm in [x for x in a.arms.split(",") if x]:
        r = compare_step(policy, batch, arm, seed=a.seed, step=a.step)
        print(f"{arm}: loss max |Δ| {r['loss_max_abs']:.3e} (rel {r['loss_max_rel']:.3e}), grad max |Δ| "
              f"{r['grad_max_abs']:.3e} (rel {r['grad_max_rel']:.3e}), keep decisions differing "
              f"{r['keep_differing']} of {r['kept']} kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
