"""End to end: the tiny CPU STAPO recipe for 2 training steps (+ one validation), then a resume to step 3, then
the same command once more, which must say the run is complete instead of training nothing silently.

Runs `bash recipes/tiny_cpu_stapo.sh` in a subprocess: recipes/common/base.sh at size `tiny` + the CPU delta
(local Ray, TransferQueue, FSDP2 on gloo, the CPU rollout server with the recipe's stop-token generation config,
the `dapo` reward manager with the project's scorer, dynamic batch size, loss_mode=stapo through the plugin's
actor option). Batch sizes are shrunk by Hydra overrides to keep it short; assets come from the cache
(`$STAPO_ASSETS` or ~/.cache/stapo_verl/tiny; built on first use).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = [
    "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
    "data.val_max_samples=32", "actor_rollout_ref.rollout.val_kwargs.n=1", "trainer.val_before_train=False",
]


def _run(run_dir: Path, *overrides: str, timeout: int = 420) -> subprocess.CompletedProcess:
    env = dict(os.environ, STAPO_RUN_DIR=str(run_dir))
    return subprocess.run(["bash", str(ROOT / "recipes" / "tiny_cpu_stapo.sh"), *SMALL, *overrides],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _records(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out.setdefault(rec["step"], {}).update(rec["data"])
    return out


def test_tiny_stapo_two_steps_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    r = _run(run_dir, "trainer.total_training_steps=2", "trainer.test_freq=2")
    log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else r.stdout
    assert r.returncode == 0, log[-6000:] + r.stderr[-3000:]

    m = _records(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2], sorted(m)
    # the STAPO loss ran inside the actor worker: its metrics come back from update_actor
    for step in (1, 2):
        stapo = [k for k in m[step] if k.startswith("actor/stapo/")]
        assert stapo, f"no actor/stapo/* metric at step {step}: {sorted(m[step])[:40]}"
        assert m[step]["critic/score/min"] >= -1.0 and m[step]["critic/score/max"] <= 1.0
    # rewards came from stapo_verl.rewards.compute_score: only it emits the no_box / timeout extra-info keys
    assert any(re.match(r"val-aux/math_dapo/(no_box|timeout)/mean@\d+", k) for k in m[2]), sorted(m[2])
    assert any(k.startswith("val-core/math_dapo/acc/mean@") for k in m[2])  # the one validation ran

    # issue 9 item 13: a clean exit, no DataLoader worker killed at shutdown
    assert "DataLoader worker" not in log and "killed by signal" not in log, log[-3000:]
    # issue 9 item 2: the rollout got the stop-token generation config the recipe wrote from the model's files
    gen_cfg = json.loads((run_dir / "ckpt" / "generation_config" / "generation_config.json").read_text())
    assert len(gen_cfg["eos_token_id"]) == len(set(gen_cfg["eos_token_id"])) >= 1

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()
    assert (run_dir / "plot.png").stat().st_size > 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2

    # resume: same run dir, one more step; verl must load global_step_2 and continue at step 3
    r2 = _run(run_dir, "trainer.total_training_steps=3", "trainer.test_freq=-1")
    log2 = (run_dir / "train.log").read_text()
    assert r2.returncode == 0, log2[-6000:] + r2.stderr[-3000:]
    assert re.search(r"Resuming from \S*global_step_2, setting global step to 2", log2), log2[-4000:]
    m2 = _records(run_dir / "metrics.jsonl")
    assert sorted(m2) == [3], sorted(m2)
    assert any(k.startswith("actor/stapo/") for k in m2[3])
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert list(run_dir.glob("metrics.*.jsonl")), "first invocation's metrics were not kept"
    # the summary reports this invocation only (step 3), not the first one's steps
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1

    # issue 11 item 3: the same command again says plainly that the run is complete; nothing is run
    r3 = _run(run_dir, "trainer.total_training_steps=3", "trainer.test_freq=-1", timeout=180)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert "is already complete: its checkpoint is at step 3" in r3.stderr
    assert (run_dir / "train.log").read_text() == log2  # no new training log
