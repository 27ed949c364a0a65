"""End to end: the tiny GRPO baseline (``bash recipes/tiny_cpu_grpo.sh``) for one training step.

GRPO's delta adds the KL loss and so verl's forward-only FSDP2 reference engine, which on CPU needs the
``CPUOffloadPolicy(pin_memory=False)`` substitution of :func:`stapo_verl.cpu.register` and an fp32 reference model
(recipes/common/cpu.sh). At step 1 the reference model *is* the policy, so in fp32 the low_var_kl loss is exactly 0
(a bf16 reference gives ~1e-4).
"""

from __future__ import annotations

from support.runs import failure_text, metrics_by_step, run_recipe


def test_tiny_grpo_one_step_with_reference_model(tmp_path):
    run_dir = tmp_path / "run"
    r = run_recipe("tiny_cpu_grpo.sh", run_dir, "trainer.total_training_steps=1", "trainer.val_before_train=False",
                   "trainer.test_freq=-1", "trainer.save_freq=-1", "data.train_batch_size=8",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4")
    assert r.returncode == 0, failure_text(run_dir, r)
    step1 = metrics_by_step(run_dir / "metrics.jsonl")[1]
    assert step1["actor/kl_coef"] == 0.001  # GRPO's KL loss is on
    assert step1["actor/kl_loss"] == 0.0  # reference == policy at step 1, both fp32
    assert not any(k.startswith(("actor/stapo/", "actor/top_entropy/")) for k in step1)  # no token mask
