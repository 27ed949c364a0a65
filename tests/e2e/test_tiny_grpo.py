"""End to end: the tiny GRPO recipe (``bash recipes/tiny_cpu_grpo.sh``: KL loss with a reference model) with the
S2T mask in front of verl's CISPO loss, 2 training steps on the FSDP engine.

GRPO's delta adds the KL loss and so verl's forward-only FSDP2 reference engine, which on CPU needs the
``CPUOffloadPolicy(pin_memory=False)`` substitution of :func:`stapo_verl.cpu.register` and an fp32 reference model
(recipes/common/cpu.sh). At step 1 the reference model *is* the policy, so in fp32 the low_var_kl loss is exactly 0
(a bf16 reference gives ~1e-4). The mask composes with ``loss_mode=cispo``: tokens are silenced, and the
policy-gradient denominator the pre-pass hands the loss is Σ K. That the KL and entropy terms are unchanged by the
mask is asserted at the engine level (``tests/integration/core/test_fsdp_engine.py``: the same weights and batch with
and without the mask give identical ``kl_loss`` and ``entropy_loss``).
"""

from __future__ import annotations

import os
from pathlib import Path

from support.runs import check_denominator, failure_text, metrics_by_step, run_config, run_recipe

PL = "actor_rollout_ref.actor.policy_loss"
#: τ_p this high makes most tokens of positive-advantage responses S2T candidates, so every step silences some
#: (the recipe's 0.1 may leave fewer than two candidates, and a lone candidate is never silenced)
MASK = ["actor_rollout_ref.actor.policy_loss.loss_mode=cispo", f"++{PL}.token_mask=s2t", f"++{PL}.s2t_tau_p=0.9"]


SMALL = ("trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=-1",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4")
INTEGRATION = "stapo_verl.integration.verl_0_9_1"


def acted(audit: Path) -> dict[str, set[int]]:
    """The audit record (``STAPO_AUDIT_DIR``, :mod:`stapo_verl.integration.verl_0_9_1.job`): ledger symbol → the
    processes in which its wrapper acted."""
    out: dict[str, set[int]] = {}
    for name in os.listdir(audit):
        pid, symbol = name.split(".", 1)
        out.setdefault(symbol, set()).add(int(pid))
    return out


def test_pass_through_tiny_grpo_baseline_no_wrapper_acts(tmp_path):
    """The tiny GRPO baseline without the plugin's switch (no token mask, ``trainer.reproducible=False``) trains,
    checkpoints and resumes on the CPU platform while no wrapper of the ledger acts in any process (driver,
    TaskRunner, workers, agent loop): the audit directory every process writes to stays empty. The run with a mask
    and the switch below fills it, so the record reaches every process."""
    run_dir, audit = tmp_path / "run", tmp_path / "audit"
    audit.mkdir()
    r = run_recipe("tiny_cpu_grpo.sh", run_dir, *SMALL, "trainer.save_freq=1", "trainer.reproducible=False",
                   STAPO_AUDIT_DIR=str(audit))
    assert r.returncode == 0, failure_text(run_dir, r)
    cfg = run_config(run_dir)
    assert (cfg.trainer.reproducible, cfg.actor_rollout_ref.actor.policy_loss.get("token_mask")) == (False, None)
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"
    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2]
    assert not [k for step in m.values() for k in step if "stapo" in k]  # nothing counted or logged
    assert (run_dir / "ckpt" / "global_step_2").is_dir()
    assert not list((run_dir / "ckpt" / "global_step_2").glob("stapo_*"))
    assert acted(audit) == {}


def test_tiny_grpo_with_cispo_and_s2t_two_steps_with_reference_model(tmp_path):
    run_dir, audit = tmp_path / "run", tmp_path / "audit"
    audit.mkdir()
    r = run_recipe("tiny_cpu_grpo.sh", run_dir, *SMALL, "trainer.save_freq=-1", *MASK, STAPO_AUDIT_DIR=str(audit))
    assert r.returncode == 0, failure_text(run_dir, r)
    # the mask alone (no diagnostics) and the recipe's switch (+trainer.reproducible=True): the series' wrappers and
    # the switch's acted, the driver's and the workers' in other processes (the audit record reaches them all), and
    # no wrapper of the diagnostics opt-in (PPOTrainer._update_actor, ...) did
    record = acted(audit)
    assert set(record) == {
        "verl.utils.config.validate_config", "verl.trainer.main_ppo.run_ppo",
        "verl.trainer.ppo.v1.trainer_base.PPOTrainer._build_replay_buffer",
        "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._select_prompt_uids",
        "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._materialize_batch",
        "verl.experimental.agent_loop.agent_loop.AgentLoopWorker._run_agent_loop",
        "verl.workers.engine_workers.TrainingWorker.train_batch",
        "verl.workers.engine_workers.ActorRolloutRefWorker.init_model",
    }, record
    worker = "verl.workers.engine_workers.ActorRolloutRefWorker.init_model"
    assert record[worker].isdisjoint(record["verl.utils.config.validate_config"])
    cfg = run_config(run_dir).actor_rollout_ref.actor
    assert (cfg.policy_loss.loss_mode, cfg.policy_loss.token_mask, cfg.use_kl_loss) == ("cispo", "s2t", True)
    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2]
    for step in (1, 2):
        check_denominator(m[step])  # the series' own metrics (s2t_metrics); the diagnostics' are not logged
        assert not [k for k in m[step] if k.endswith(("silenced_grad_share", "pos_adv_below_tau_p_frac"))]
        assert m[step]["actor/kl_coef"] == 0.001  # GRPO's KL loss is on
    assert m[1]["actor/kl_loss"] == 0.0  # reference == policy at step 1, both fp32
    assert m[2]["actor/kl_loss"] > 0.0  # one update later the policy has moved away from the reference
