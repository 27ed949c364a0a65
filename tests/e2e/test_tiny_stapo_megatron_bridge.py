"""End to end on the GPU image's stack: ``STAPO_STACK=bridge ENGINE=megatron bash recipes/tiny_cpu_stapo.sh``.

The real ``python -m verl.trainer.main_ppo`` with ``model_engine=megatron`` in ``.venv-bridge`` (Python 3.12, torch
2.11.0, megatron-core 0.18.0, Megatron-Bridge 0.5.1, nvidia-modelopt 0.44.0, transformers 5.9.0; the recipe creates it
on first use) through verl's default weight path, Megatron-Bridge (``megatron.vanilla_mbridge=False``):
``AutoBridge.from_hf_pretrained``, the HF weight load, the per-tensor export to the rollout at every weight sync, and
the checkpoint save and resume. TP=2 over 2 virtual GPUs (gloo) with the STAPO recipe's Megatron settings from
recipes/common/base.sh: bf16, the distributed optimizer, full recompute, dynamic batch size, remove-padding. What the
CPU platform replaces on this stack is in ``stapo_verl.cpu.ledger`` (``BRIDGE_PATCHES``, the megatron-core entries) and
recipes/common/cpu.sh (sequence parallelism off, the CPU rollout server). 2 steps with one validation and a checkpoint,
then a resume to step 3. Batch sizes are shrunk as in ``test_tiny_stapo.py``.
"""

from __future__ import annotations

from support.runs import SMALL, check_mask_and_denominator, failure_text, metrics_by_step, reproducible, run_config, \
    run_recipe

ENV = {"STAPO_STACK": "bridge", "ENGINE": "megatron", "STAPO_VENV": ""}  # the recipe picks (and creates) .venv-bridge


def test_tiny_stapo_through_megatron_bridge_tp2_two_steps_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=2", "trainer.test_freq=2",
                   "trainer.save_freq=2", timeout=1500, **ENV)
    assert r.returncode == 0, failure_text(run_dir, r)
    cfg = run_config(run_dir)
    actor = cfg.actor_rollout_ref.actor
    assert cfg.model_engine == "megatron" and actor.strategy == "megatron"
    assert actor.megatron.use_mbridge and not actor.megatron.vanilla_mbridge  # verl's default: Megatron-Bridge
    assert actor.megatron.tensor_model_parallel_size == 2 and cfg.trainer.n_gpus_per_node == 2
    assert actor.megatron.use_distributed_optimizer and actor.megatron.override_transformer_config[
        "recompute_granularity"] == "full"
    assert actor.use_dynamic_bsz and cfg.actor_rollout_ref.model.use_remove_padding
    assert actor.megatron.dtype == "bfloat16" and actor.policy_loss.loss_mode == "stapo"
    train_log = (run_dir / "train.log").read_text(errors="replace")
    assert "/python3.12/site-packages/megatron/bridge/" in train_log  # the workers ran Megatron-Bridge's code

    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2], sorted(m)
    for step in (1, 2):
        keys = {"actor/stapo/num_masked", "actor/stapo/num_candidates", "actor/pg_loss", "actor/grad_norm",
                "actor/stapo/lm_head_grad_norm"}
        assert keys <= set(m[step]), keys - set(m[step])
        assert m[step]["actor/grad_norm"] > 0
        # the rollout samples with the weights Megatron-Bridge's per-tensor export sent it (verl syncs before each
        # generation): its token probabilities track the bf16 actor's; a wrong export (names, TP shards) would not
        assert m[step]["training/rollout_actor_probs_pearson_corr"] > 0.99, m[step]
    check_mask_and_denominator(m)
    assert "val-core/math_dapo/acc/mean@1" in m[2]  # the one validation ran

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()

    r2 = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=3", "trainer.test_freq=-1",
                    "trainer.save_freq=3", timeout=1500, **ENV)
    assert r2.returncode == 0, failure_text(run_dir, r2)
    assert f"training {run_dir} (steps 3-3)" in r2.stdout  # resumed from global_step_2
    m2 = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m2) == [1, 2, 3], sorted(m2)
    assert reproducible(m2)[1] == reproducible(m)[1] and "actor/stapo/num_masked" in m2[3]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
