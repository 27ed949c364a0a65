#!/usr/bin/env bash
# STAPO on Qwen3-1.7B-Base (paper setup, recipes/common/base.sh; size deltas and memory: docs/recipes.md).
#   recipes/qwen3_1.7b_stapo.sh [--dry-run] [hydra overrides...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" 1.7b stapo "$@"
