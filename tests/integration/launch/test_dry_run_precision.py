"""``PRECISION=fp8 bash recipes/qwen3_8b_stapo.sh --dry-run`` printed the BF16 memory plan and an empty
``derived.worker_env`` although the overrides set ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES`` for every worker: the
composed 8B config's settings and plan, for both precisions."""

from __future__ import annotations

import pytest
from support.recipes import bash

from stapo_verl.launch import dryrun, memory_plan
from stapo_verl.launch.compose import compose_config


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_the_8b_plan_and_worker_env_follow_the_precision(precision):
    proc = bash(["recipes/qwen3_8b_stapo.sh", "--print-overrides"], env={"PRECISION": precision})
    assert proc.returncode == 0, proc.stderr
    config = compose_config(proc.stdout.split("\n")[:-1])
    settings = dict(dryrun._summary(config))
    env = settings["derived.worker_env"]
    plan, _ = memory_plan.plan_for_config(config, 80.0)
    if precision == "fp8":
        assert env.get("NVTE_FP8_BLOCK_SCALING_FP32_SCALES") == "1"
        assert plan.lines()[1].startswith("  precision assumed: FP8 (TE hybrid/blockwise")
        assert "vLLM fp8 weights" in plan.lines()[1]
    else:
        assert "NVTE_FP8_BLOCK_SCALING_FP32_SCALES" not in env
        assert plan.lines()[1].startswith("  precision assumed: BF16")
    assert all(isinstance(k, str) for k in env)
