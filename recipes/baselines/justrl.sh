#!/usr/bin/env bash
# JustRL baseline (spec §9.3: verl vanilla loss with clip-higher 0.2/0.28, c=10; STAPO minus S2T).
#   recipes/baselines/justrl.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 <1.7b|8b|14b> [--dry-run] [hydra overrides...]" >&2
    exit 2
fi
size=$1
shift
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "$size" justrl "$@"
