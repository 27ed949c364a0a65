#!/usr/bin/env bash
# STAPO on Qwen3-14B-Base (paper setup, recipes/common/base.sh; size deltas and memory: docs/recipes.md).
#   recipes/qwen3_14b_stapo.sh [--dry-run] [hydra overrides...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" 14b stapo "$@"
