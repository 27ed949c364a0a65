#!/usr/bin/env bash
# The project's test command (README, .ci/run): set up .venv if needed, then run the whole CPU test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_stapo_loss_on_cpu.py -x`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup_env.sh")"
export RAY_AUTH_MODE=disabled WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export TORCHDYNAMO_DISABLE=1   # verl's vocab-parallel entropy wraps a helper in torch.compile; no JIT on CPU CI
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 "$@"
