#!/usr/bin/env bash
# GRPO baseline (symmetric clip 0.2, seq-mean-token-mean, KL loss low_var_kl beta=0.001; recipes/common/base.sh).
#   recipes/baselines/grpo.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]   (run.sh checks the size)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "${1:-}" grpo "${@:2}"
