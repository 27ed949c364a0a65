#!/usr/bin/env bash
# JustRL baseline (vanilla loss, clip-higher 0.2/0.28, no KL).
#   recipes/baselines/justrl.sh <1.7b|8b|14b> [--dry-run] [hydra overrides...]   (run.sh checks the size)
exec bash "$(dirname "${BASH_SOURCE[0]}")/../run.sh" "${1:-}" justrl "${@:2}"
