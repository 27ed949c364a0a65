#!/usr/bin/env bash
# 20-Entropy baseline (spec §9.2/A18: top 20 % tokens by current-policy entropy, loss_mode=top_entropy).
#   recipes/baselines/top_entropy.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 <1.7b|8b|14b> [--dry-run] [hydra overrides...]" >&2
    exit 2
fi
size=$1
shift
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$size" top_entropy "$@"
