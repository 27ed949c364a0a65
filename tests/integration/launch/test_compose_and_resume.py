"""stapo_verl.launch composes the config ``main_ppo`` composes, and reads verl's resume rule from it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from stapo_verl.launch.compose import compose_config
from stapo_verl.launch.resume import resume_state
from support.procs import child_env

OVERRIDES = [
    "actor@actor_rollout_ref.actor=stapo_dp_actor",
    "actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.01",
    "++trainer.total_training_steps=22",
    "trainer.total_training_steps=21",  # a later override of the same key wins, as in Hydra
    "+ray_kwargs.ray_init.runtime_env.env_vars.STAPO_X='1'",
]


def test_compose_equals_what_main_ppo_composes():
    """``python -m verl.trainer.main_ppo --cfg job`` prints the config its @hydra.main composed (Hydra's own flag)."""
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", *OVERRIDES],
                          capture_output=True, text=True, timeout=300, env=child_env(VERL_PLATFORM="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = OmegaConf.create(proc.stdout)
    ours = compose_config(OVERRIDES)
    assert OmegaConf.to_container(ours) == OmegaConf.to_container(theirs)
    assert ours.trainer.total_training_steps == 21 and ours.actor_rollout_ref.actor.policy_loss.s2t_tau_p == 0.01


def _ckpt(base, step: int) -> None:
    (base / f"global_step_{step}" / "actor").mkdir(parents=True)
    (base / "latest_checkpointed_iteration.txt").write_text(str(step))


@pytest.mark.parametrize(
    "extra,expect",
    [
        ([], (20, 20, True)),
        (["++trainer.total_training_steps=22"], (20, 22, False)),
        (["trainer.resume_mode=disable"], (None, 20, False)),
        (["trainer.resume_mode=resume_path", "trainer.resume_from_path=CKPT/global_step_20"], (20, 20, True)),
    ],
)
def test_resume_state_follows_verls_rule(tmp_path, extra, expect):
    ckpt = tmp_path / "ckpt"
    _ckpt(ckpt, 20)
    extra = [e.replace("CKPT", str(ckpt)) for e in extra]
    cfg = compose_config([f"trainer.default_local_dir={ckpt}", "trainer.total_training_steps=20", *extra])
    state = resume_state(cfg)
    assert (state.checkpoint_step, state.total_steps, state.complete) == expect


def test_resume_state_without_a_step_count_uses_epochs_times_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"data_source": ["x"] * 50}), tmp_path / "train.parquet")
    _ckpt(tmp_path / "ckpt", 10)
    cfg = compose_config([f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.total_training_steps=null",
                          "trainer.total_epochs=2", "data.train_batch_size=16",
                          f"data.train_files={tmp_path / 'train.parquet'}"])
    state = resume_state(cfg)
    assert state.total_steps == 6 and state.complete  # 2 epochs x floor(50 / 16) = 6 <= checkpoint step 10


def test_bad_resume_mode_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="trainer.resume_mode='sometimes': allowed auto, disable, resume_path"):
        resume_state(compose_config(["trainer.resume_mode=sometimes"]))
