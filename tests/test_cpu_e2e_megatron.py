"""End to end on the production engine: ``ENGINE=megatron bash recipes/tiny_cpu_stapo.sh`` — the real
``python -m verl.trainer.main_ppo`` with ``model_engine=megatron`` at TP=2 over 2 virtual GPUs (gloo), mbridge +
Megatron-Core's local spec through stapo_verl's CPU shims, bf16 (verl's Megatron dtype), the distributed optimizer
and full recompute from recipes/common/base.sh, loss_mode=stapo. 2 steps with one validation and a checkpoint, then
a resume to step 3. Batch sizes are shrunk as in ``test_cpu_e2e.py``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from test_cpu_e2e import SMALL, _records

ROOT = Path(__file__).resolve().parents[1]


def _run(run_dir: Path, *overrides: str, timeout: int = 720) -> subprocess.CompletedProcess:
    env = dict(os.environ, STAPO_RUN_DIR=str(run_dir), ENGINE="megatron")
    return subprocess.run(["bash", str(ROOT / "recipes" / "tiny_cpu_stapo.sh"), *SMALL, *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_tiny_stapo_on_megatron_tp2_two_steps_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    r = _run(run_dir, "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=2")
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else r.stdout
    assert r.returncode == 0, log[-6000:] + r.stderr[-3000:]
    # the Megatron engine ran at TP=2 on the CPU platform
    assert "tensor_model_parallel_size=2" in log and "'model_engine': 'megatron'" in log, log[-3000:]

    m = _records(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2], sorted(m)
    for step in (1, 2):
        keys = {"actor/stapo/num_masked", "actor/stapo/num_candidates", "actor/pg_loss", "actor/grad_norm"}
        assert keys <= set(m[step])
        # tau_h is logged exactly when the mini-batch had candidates (it is undefined for an empty population)
        assert ("actor/stapo/tau_h" in m[step]) == (m[step]["actor/stapo/num_candidates"] > 0), m[step]
        assert m[step]["actor/grad_norm"] > 0
    assert any(k.startswith("val-core/math_dapo/acc/mean@") for k in m[2])  # the one validation ran

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()

    r2 = _run(run_dir, "trainer.total_training_steps=3", "trainer.test_freq=-1", "trainer.save_freq=3")
    log2 = (run_dir / "train.log").read_text()
    assert r2.returncode == 0, log2[-6000:] + r2.stderr[-3000:]
    assert re.search(r"Resuming from \S*global_step_2, setting global step to 2", log2), log2[-4000:]
    m2 = _records(run_dir / "metrics.jsonl")
    assert sorted(m2) == [3], sorted(m2)
    assert any(k.startswith("actor/stapo/") for k in m2[3])
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
