"""End to end on the production engine and the GPU image's stack: ``STAPO_STACK=bridge ENGINE=megatron bash
recipes/tiny_cpu_stapo.sh`` — the real ``python -m verl.trainer.main_ppo`` with ``model_engine=megatron`` in
``.venv-bridge`` (Python 3.12, torch 2.11.0, megatron-core 0.18.0, Megatron-Bridge 0.5.1, nvidia-modelopt 0.44.0,
transformers 5.9.0; the recipe creates it on first use) through verl's default weight path, Megatron-Bridge
(``megatron.vanilla_mbridge=False``): ``AutoBridge.from_hf_pretrained``, the HF weight load, the per-tensor export to
the rollout at every weight sync, the checkpoint save and resume. TP=2 over 2 virtual GPUs (gloo), bf16 (verl's
Megatron dtype), with the STAPO recipe's Megatron settings from recipes/common/base.sh (distributed optimizer, full
recompute, dynamic batch size, remove-padding), Megatron-Core's local spec through the CPU platform's shims (what they
replace: ``stapo_verl.cpu.ledger``, ``BRIDGE_PATCHES`` and the megatron-core entries; recipes/common/cpu.sh turns
sequence parallelism off), and the S2T mask in front of verl's GSPO loss (``loss_mode=gspo``; the recipe's actor
option sets ``token_mask=s2t``). 2 steps with one validation and a checkpoint, then a resume to step 3. Batch sizes
are shrunk as in ``test_tiny_stapo.py``. ``loss_mode=stapo`` on the Megatron engine is checked layout by layout in
``tests/integration/core/test_megatron_engine.py`` (the default stack's mbridge path) and
``tests/integration/cpu/test_megatron_bridge_route.py`` (Megatron-Bridge).
"""

from __future__ import annotations

import subprocess

from support.procs import REPO
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
GSPO = ["actor_rollout_ref.actor.policy_loss.loss_mode=gspo", "actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.9"]
#: a token table every step (the default is one at each validation)
TABLES = ["actor_rollout_ref.actor.policy_loss.dump_every=1"]
#: the image's stack; the recipe picks (and creates) .venv-bridge
ENV = {"ENGINE": "megatron", "STAPO_STACK": "bridge", "STAPO_VENV": ""}


def test_tiny_stapo_on_megatron_tp2_two_steps_then_resume(tmp_path):
    run_dir = tmp_path / "run"
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, *GSPO, *TABLES, "trainer.total_training_steps=2",
                   "trainer.test_freq=2", "trainer.save_freq=2", timeout=1500, **ENV)
    assert r.returncode == 0, failure_text(run_dir, r)
    cfg = run_config(run_dir)
    assert cfg.model_engine == "megatron" and cfg.actor_rollout_ref.actor.strategy == "megatron"
    actor = cfg.actor_rollout_ref.actor
    assert actor.megatron.tensor_model_parallel_size == 2 and cfg.trainer.n_gpus_per_node == 2
    assert actor.megatron.use_mbridge and not actor.megatron.vanilla_mbridge  # verl's default: Megatron-Bridge
    assert actor.megatron.use_distributed_optimizer and actor.megatron.dtype == "bfloat16"
    assert actor.megatron.override_transformer_config["recompute_granularity"] == "full"
    assert actor.use_dynamic_bsz and cfg.actor_rollout_ref.model.use_remove_padding
    # the environment that ran has Megatron-Bridge and no mbridge: the weights went through Megatron-Bridge
    probe = ("import importlib.util as u, importlib.metadata as m; "
             "print(u.find_spec('mbridge') is None, m.version('megatron-bridge'), m.version('megatron-core'))")
    out = subprocess.run([str(REPO / ".venv-bridge" / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["True", "0.5.1", "0.18.0"], out
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
        # the rollout samples with the weights Megatron-Bridge's per-tensor export sent it (verl syncs before each
        # generation): its token probabilities track the bf16 actor's; a wrong export (names, TP shards) would not
        assert m[step]["training/rollout_actor_probs_pearson_corr"] > 0.99, m[step]
    check_mask_and_denominator(m)
    assert "val-core/math_dapo/acc/mean@1" in m[2]  # the one validation ran
    # the recipe's default trackers include TensorBoard: the token tables, histograms and charts are there
    check_tensorboard({"dir": run_dir, "tb": event_accumulator(run_dir), "metrics": m}, 2, tau_p=0.9)
    assert m[1]["actor/stapo/lm_head_grad_norm"] > 0  # distributed optimizer at DP=1: readable

    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (ckpt / "global_step_2" / "actor").is_dir()

    r2 = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, *GSPO, "trainer.total_training_steps=3",
                    "trainer.test_freq=-1", "trainer.save_freq=3", timeout=1500, **ENV)
    assert r2.returncode == 0, failure_text(run_dir, r2)
    m2 = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m2) == [1, 2, 3], sorted(m2)  # resumed from global_step_2: step 3 joins the run's metrics
    assert reproducible(m2)[1] == reproducible(m)[1] and "actor/stapo/num_masked" in m2[3]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
