#!/usr/bin/env bash
# 20-Entropy baseline (loss_mode=vanilla token_mask=top_entropy: the policy gradient of the 20 % highest
# old-policy-entropy tokens of each mini-batch).
#   recipes/baselines/top_entropy.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]   (run.sh checks the size)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "${1:-}" top_entropy "${@:2}"
