#!/usr/bin/env bash
# 20-Entropy baseline (loss_mode=top_entropy, actor.calculate_entropy=True).
#   recipes/baselines/top_entropy.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]   (run.sh checks the size)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "${1:-}" top_entropy "${@:2}"
