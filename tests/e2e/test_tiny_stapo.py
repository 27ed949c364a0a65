"""End to end: ``bash recipes/tiny_cpu_stapo.sh`` for 2 training steps (+ one validation), then a resume to step 3,
then the same command once more, which must train nothing.

The real ``python -m verl.trainer.main_ppo`` through the recipe: recipes/common/base.sh at size ``tiny`` + the CPU
delta (local Ray, TransferQueue, FSDP2 on gloo, the CPU rollout server with the recipe's stop-token generation
config, the ``dapo`` reward manager with the project's scorer, dynamic batch size, ``loss_mode=stapo`` through the
plugin's actor option). Batch sizes are shrunk by Hydra overrides (:data:`support.runs.SMALL`); the assets come from
the cache (``$STAPO_ASSETS`` or ~/.cache/stapo_verl/tiny; built on first use).
"""

from __future__ import annotations

import json
import re

from support.runs import SMALL, failure_text, metrics_by_step, run_config, run_recipe


def test_tiny_stapo_two_steps_then_resume_then_nothing_to_do(tmp_path):
    run_dir = tmp_path / "run"
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=2", "trainer.test_freq=2")
    assert r.returncode == 0, failure_text(run_dir, r)

    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2], sorted(m)
    for step in (1, 2):
        # the S2T mask ran inside the actor worker: its statistics come back from update_actor
        assert m[step]["actor/stapo/num_candidates"] >= m[step]["actor/stapo/num_masked"] >= 0
        assert 0.0 <= m[step]["actor/stapo/masked_frac"] <= 1.0
        assert -1.0 <= m[step]["critic/score/min"] <= m[step]["critic/score/max"] <= 1.0
    # rewards came from stapo_verl.rewards: only it adds the no_box / timeout keys to the reward's extra info
    assert any(re.fullmatch(r"val-aux/math_dapo/(no_box|timeout)/mean@1", k) for k in m[2]), sorted(m[2])
    assert 0.0 <= m[2]["val-core/math_dapo/acc/mean@1"] <= 1.0  # the one validation ran, on the synthetic rows only
    assert not any(k.startswith("val-core/") and "math_dapo" not in k for k in m[2])

    cfg = run_config(run_dir)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "stapo"
    assert cfg.data.dataloader_num_workers == 0
    # the rollout got the stop-token generation config the recipe wrote from the model's own files
    gen_cfg = json.loads((run_dir / "ckpt" / "generation_config" / "generation_config.json").read_text())
    assert len(gen_cfg["eos_token_id"]) == len(set(gen_cfg["eos_token_id"])) == 2

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()
    assert (run_dir / "plot.png").stat().st_size > 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert (run_dir / "train.log").stat().st_size > 0

    # resume: same run dir, one more step; verl loads global_step_2 and trains step 3 only
    r2 = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=3", "trainer.test_freq=-1")
    assert r2.returncode == 0, failure_text(run_dir, r2)
    m2 = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m2) == [3], sorted(m2)
    assert "actor/stapo/num_masked" in m2[3]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    assert len(list(run_dir.glob("metrics.*.jsonl"))) == 1  # the first invocation's metrics were kept
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1  # this invocation only

    # the same command again: the checkpoint is at the last step, so nothing runs and nothing is rewritten
    before = {p.name: p.read_bytes() for p in (run_dir / "metrics.jsonl", run_dir / "wall.json", run_dir / "summary.json")}
    r3 = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=3", timeout=240)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert len(list(run_dir.glob("metrics.*.jsonl"))) == 1
