"""End to end on the production engine: ``ENGINE=megatron bash recipes/tiny_cpu_stapo.sh`` — the real
``python -m verl.trainer.main_ppo`` with ``model_engine=megatron`` at TP=2 over 2 virtual GPUs (gloo), mbridge +
Megatron-Core's local spec through stapo_verl's CPU shims, bf16 (verl's Megatron dtype), the distributed optimizer
and full recompute from recipes/common/base.sh, with the S2T mask in front of verl's GSPO loss
(``loss_mode=gspo``; the recipe's actor option sets ``token_mask=s2t``). 2 steps with one validation and a
checkpoint, then a resume to step 3. Batch sizes are shrunk as in ``test_tiny_stapo.py``. ``loss_mode=stapo`` on
the Megatron engine is checked layout by layout in ``tests/integration/core/test_megatron_engine.py``.
"""

from __future__ import annotations

from support.runs import (
    SMALL,
    check_mask_and_denominator,
    failure_text,
    metrics_by_step,
    reproducible,
    run_config,
    run_recipe,
)
from support.trackers import check_tensorboard, event_accumulator

#: S2T in front of GSPO; τ_p this high gives every step many candidates at this scale
GSPO = ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.policy_loss.tau_p=0.9"]
#: a token table every step (the default is one at each validation)
TABLES = ["actor_rollout_ref.actor.policy_loss.dump_every=1"]


def test_tiny_stapo_on_megatron_tp2_two_steps_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, *GSPO, *TABLES, "trainer.total_training_steps=2",
                   "trainer.test_freq=2", "trainer.save_freq=2", timeout=900, ENGINE="megatron")
    assert r.returncode == 0, failure_text(run_dir, r)
    cfg = run_config(run_dir)
    assert cfg.model_engine == "megatron" and cfg.actor_rollout_ref.actor.strategy == "megatron"
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2
    assert cfg.trainer.n_gpus_per_node == 2
    assert (cfg.actor_rollout_ref.actor.policy_loss.loss_mode, cfg.actor_rollout_ref.actor.policy_loss.token_mask) == (
        "gspo", "s2t")

    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2], sorted(m)
    for step in (1, 2):
        keys = {"actor/stapo/num_masked", "actor/stapo/num_candidates", "actor/pg_loss", "actor/grad_norm"}
        assert keys <= set(m[step])
        # tau_h is logged exactly when the mini-batch had candidates (it is undefined for an empty population)
        assert ("actor/stapo/tau_h" in m[step]) == (m[step]["actor/stapo/num_candidates"] > 0), m[step]
        assert m[step]["actor/grad_norm"] > 0
    check_mask_and_denominator(m)
    assert "val-core/math_dapo/acc/mean@1" in m[2]  # the one validation ran
    # the recipe's default trackers include TensorBoard: the token tables, histograms and charts are there
    check_tensorboard({"dir": run_dir, "tb": event_accumulator(run_dir), "metrics": m}, 2, tau_p=0.9)
    assert m[1]["actor/stapo/lm_head_grad_norm"] > 0  # distributed optimizer at DP=1: readable

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()

    r2 = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, *GSPO, "trainer.total_training_steps=3",
                    "trainer.test_freq=-1", "trainer.save_freq=3", timeout=900, ENGINE="megatron")
    assert r2.returncode == 0, failure_text(run_dir, r2)
    m2 = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m2) == [1, 2, 3], sorted(m2)  # resumed from global_step_2: step 3 joins the run's metrics
    assert reproducible(m2)[1] == reproducible(m)[1] and "actor/stapo/num_masked" in m2[3]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
