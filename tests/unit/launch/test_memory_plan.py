"""The memory plan (``stapo_verl.launch.memory_plan``) against hand-computed values for Qwen3-8B at TP2 on 8 GPUs.

Qwen3-8B's ``config.json``: hidden 4096, 36 layers, vocab 151,936, intermediate 12,288, 32 heads / 8 KV heads,
head_dim 128, untied embeddings. By hand:

* one layer's TP-split weights: q 4096·4096 + k, v 2·4096·1024 + o 4096·4096 + MLP 3·4096·12288 = 192,937,984;
  its norms (2·4096 + 2·128 = 8,448) on every rank; embedding + LM head 2·151,936·4096 = 1,244,659,712; final norm 4096.
  P = 36·(192,937,984 + 8,448) + 1,244,659,712 + 4096 = 8,190,735,360.
* per GPU at TP2: 36·(96,468,992 + 8,448) + 622,329,856 + 4096 = 4,095,521,792 parameters:
  bf16 8.191 GB, fp32 main grads 16.382 GB, optimizer 12 B / DP 4 = 12.287 GB.
* one bf16 logits copy: T·151,936/2·2 B = 4.979 GB at 32,768 tokens, 9.957 GB at 65,536.
* full recompute with sequence parallelism at 32,768: checkpointed 36·32768·4096·2/2 = 4.832 GB; live layer
  34·32768·4096/2 = 2.282 GB.
* a no-grad layer's MLP transient at 65,536: 65536·(4·12288/2 + 2·12288/2 + 2·4096) = 2.953 GB.
"""

from __future__ import annotations

import dataclasses

import pytest

from stapo_verl.launch import memory_plan as M

QWEN3_8B = M.ModelShape(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=12288,
                        vocab=151936, tied=False)
RECIPE_8B = M.Settings(tp=2, pp=1, cp=1, dp=4, rollout_tp=2, gpu_util=0.6, param_offload=True,
                       optimizer_offload=True, distributed_optimizer=True, sequence_parallel=True, full_recompute=True,
                       train_tokens=32768, logprob_tokens=65536, current_tokens=None, update_entropy=False,
                       chunking=False, fused=False, bucket_mb=2048, longest=16384)
RES = M.RESERVE_GB


def test_parameter_counts_by_hand():
    assert QWEN3_8B.params() == 8_190_735_360
    assert QWEN3_8B.params_per_gpu(2) == 4_095_521_792
    assert M.KNOWN_MODELS["qwen3-8b"] == QWEN3_8B


def test_each_phase_of_the_8b_recipe_by_hand():
    plan = M.plan(QWEN3_8B, RECIPE_8B, 80.0)
    up = plan.phase("actor update")
    assert up.term("params") == pytest.approx(8.191044, rel=1e-6)
    assert up.term("grads") == pytest.approx(16.382087, rel=1e-6)
    assert up.term("optimizer") == pytest.approx(12.286565, rel=1e-6)
    assert up.term("checkpointed") == pytest.approx(4.831838, rel=1e-6)
    assert up.term("live layer") == pytest.approx(2.281701, rel=1e-6)
    assert up.term("logits") == pytest.approx(3 * 4.978639, rel=1e-6)
    assert up.total_gb == pytest.approx(8.191044 + 16.382087 + 12.286565 + 4.831838 + 2.281701 + 14.935917 + RES)
    old = plan.phase("old-log-prob with entropy")  # eval mode: parameters only, 4 logits copies
    assert [t.name for t in old.terms] == ["params", "logits", "activations", "reserve"]
    assert old.term("logits") == pytest.approx(4 * 9.957278, rel=1e-6)
    assert old.term("activations") == pytest.approx(2.952790, rel=1e-6)
    roll = plan.phase("rollout")  # everything of Megatron offloaded
    assert roll.total_gb == pytest.approx(0.6 * 80 + RES)
    sync = plan.phase("weight sync")
    assert sync.total_gb == pytest.approx(8.191044 + 2 * 8_190_735_360 / 2 / 1e9 + 2048 * 2**20 / 1e9
                                          + 151936 * 4096 * 2 / 1e9 + RES)
    assert plan.fits and plan.peak is up and all(not p.advice for p in plan.phases)  # none within 10 % of 80 GB


def test_current_minibatch_fits_at_the_training_budget_and_not_at_the_log_prob_one():
    plan = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, current_tokens=32768), 80.0)
    cur = plan.phase("current-policy forward")
    assert cur.total_gb == pytest.approx(8.191044 + 16.382087 + 12.286565 + 4 * 4.978639 + 2.952790 / 2 + RES,
                                         rel=1e-6)
    assert plan.fits and cur.total_gb < 80
    at_logprob_budget = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, current_tokens=65536), 80.0)
    over = at_logprob_budget.phase("current-policy forward")
    assert over.total_gb == pytest.approx(36.859696 + 4 * 9.957278 + 2.952790 + RES, rel=1e-6)  # ≈ 83.6 GB
    assert not at_logprob_budget.fits and "does not fit" in at_logprob_budget.lines()[-1]


def test_a_phase_within_ten_percent_names_the_options_and_what_they_save():
    plan = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, current_tokens=65536), 80.0)
    advice = plan.phase("current-policy forward").advice
    chunk, fused, budget = advice
    assert chunk.startswith(f"{M.CHUNKING_KEY}=True: -0.0 GB")  # the peak is the fp32 copy after the entropy
    assert fused == f"{M.FUSED_KEY}=True: -{4 * 9.957278:.1f} GB (no full logits)"
    # the largest multiple of 1024 that brings it under 72 GB: 36.86 + 4 x T x 151936 + ... <= 72 - 4
    assert budget.startswith(f"{M.TRAIN_BUDGET_KEY}=")
    tokens = int(budget.split("=")[1].split(":")[0])
    lower = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, current_tokens=tokens), 80.0)
    higher = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, current_tokens=tokens + M.BUDGET_STEP), 80.0)
    assert lower.phase("current-policy forward").total_gb <= 72 < higher.phase("current-policy forward").total_gb
    # the old-log-prob pass on a 60 GB GPU: the fused kernels remove its logits
    small = M.plan(QWEN3_8B, RECIPE_8B, 60.0).phase("old-log-prob with entropy")
    assert any(a.startswith(f"{M.FUSED_KEY}=True: -39.8 GB") for a in small.advice)


def test_offload_off_keeps_the_training_state_in_the_rollout():
    plan = M.plan(QWEN3_8B, dataclasses.replace(RECIPE_8B, param_offload=False, optimizer_offload=False), 80.0)
    assert plan.phase("rollout").total_gb == pytest.approx(36.859696 + 48 + RES, rel=1e-6)
    assert plan.phase("old-log-prob with entropy").term("grads") == pytest.approx(16.382087, rel=1e-6)


def test_fp8_changes_the_plan_by_hand_and_the_plan_names_its_precision():
    """PRECISION=fp8 printed the BF16 plan. Per GPU (8B, TP 2): TE keeps an FP8 copy and a transpose of each GEMM
    weight beside the bf16 weights, +2 B x 36 layer shards; vLLM's fp8 weights are 1 B per linear parameter."""
    fp8 = dataclasses.replace(RECIPE_8B, fp8="hybrid", fp8_recipe="blockwise", rollout_fp8=True)
    bf16_plan, fp8_plan = M.plan(QWEN3_8B, RECIPE_8B, 80.0), M.plan(QWEN3_8B, fp8, 80.0)
    gemm = 36 * QWEN3_8B.layer_params() / 2
    assert gemm == 36 * (4096 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 + 3 * 4096 * 12288) / 2 == 3_472_883_712
    up, up16 = fp8_plan.phase("actor update"), bf16_plan.phase("actor update")
    assert up.term("params") == pytest.approx(up16.term("params") + 2 * gemm / 1e9, rel=1e-9)
    assert up.total_gb == pytest.approx(up16.total_gb + 2 * gemm / 1e9, rel=1e-9)
    linear = 36 * QWEN3_8B.layer_params()
    vllm = ((QWEN3_8B.params() - linear) * 2 + linear) / 2 / 1e9
    assert fp8_plan.phase("weight sync").term("vLLM weights") == pytest.approx(vllm, rel=1e-9)
    assert bf16_plan.phase("weight sync").term("vLLM weights") == pytest.approx(2 * QWEN3_8B.params() / 2 / 1e9)
    held = dataclasses.replace(fp8, fp8_param=True)  # fp8 parameters: 1 B per GEMM parameter, no cache
    assert M.plan(QWEN3_8B, held, 80.0).phase("actor update").term("params") == pytest.approx(
        up16.term("params") - gemm / 1e9, rel=1e-9)
    assert bf16_plan.lines()[1] == ("  precision assumed: BF16 (bf16 parameters and activations, fp32 main grads and "
                                    "Adam; vLLM bf16 weights)")
    assert fp8_plan.lines()[1].startswith("  precision assumed: FP8 (TE hybrid/blockwise: bf16 parameters + TE's "
                                          "cached FP8 weight copies")
