#!/usr/bin/env bash
# Tiny end-to-end STAPO run on CPU: recipes/common/base.sh at size `tiny` + the CPU delta of
# recipes/common/cpu.sh (ENGINE=fsdp|megatron, ROLLOUT=cpu|vllm). Creates .venv (.venv-vllm) and the tiny assets if missing.
#   recipes/tiny_cpu_stapo.sh [--dry-run | --print-overrides] [hydra overrides...]
# Outputs: outputs/tiny_cpu_stapo/ (STAPO_RUN_DIR): train.log, metrics.jsonl, the report, ckpt/
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" tiny stapo "$@"
