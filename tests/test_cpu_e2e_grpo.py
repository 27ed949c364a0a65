"""End to end: the tiny GRPO baseline (`bash recipes/tiny_cpu_grpo.sh`) for one training step.

GRPO's delta adds the KL loss and so verl's forward-only FSDP2 reference engine, which on CPU needs the
``CPUOffloadPolicy(pin_memory=False)`` substitution of :func:`stapo_verl.cpu.register` and an fp32 reference model
(recipes/common/cpu.sh). At step 1 the reference model *is* the policy, so in fp32 the low_var_kl loss is exactly 0
(a bf16 reference gives ~1e-4, and TransferQueue logs a dtype mismatch of its log-prob field).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_grpo_one_step_with_reference_model(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, STAPO_RUN_DIR=str(run_dir))
    overrides = ["trainer.total_training_steps=1", "trainer.val_before_train=False", "trainer.test_freq=-1",
                 "trainer.save_freq=-1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 "actor_rollout_ref.rollout.n=4"]
    r = subprocess.run(["bash", str(ROOT / "recipes" / "tiny_cpu_grpo.sh"), *overrides], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else r.stdout
    assert r.returncode == 0, log[-6000:] + r.stderr[-3000:]
    assert "dtype mismatch" not in log, log[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    step1 = {k: v for row in rows if row["step"] == 1 for k, v in row["data"].items()}
    assert step1["actor/kl_coef"] == 0.001  # GRPO's KL loss is on (spec A17)
    assert step1["actor/kl_loss"] == 0.0  # reference == policy at step 1, both fp32
    assert not any(k.startswith("actor/stapo/") for k in step1)  # plain vanilla loss
