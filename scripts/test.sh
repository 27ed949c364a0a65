#!/usr/bin/env bash
# The project's test command (README, .ci/run): set up .venv if needed, then run the CPU test suite.
#   bash scripts/test.sh                      everything (what CI runs)
#   bash scripts/test.sh -m unit              the fast subset: in-process tests (about 40 s on 2 idle cores)
#   bash scripts/test.sh -m "not e2e"         unit + integration (engines, gloo jobs, Ray), no full main_ppo runs
#   bash scripts/test.sh tests/unit/launch -x any pytest arguments
# Kinds (tests/conftest.py marks each test by its directory): tests/unit, tests/integration, tests/e2e.
# Two pytest-xdist workers (STAPO_TEST_WORKERS, default 2; -n 0 runs in this process). The files that run main_ppo
# or the launcher up to Ray form two chains (tests/conftest.py CHAINS), each run in order on one worker; every other
# test file goes, whole, to whichever worker is free (tests/conftest.py pytest_xdist_make_scheduler). Much of an e2e
# run waits on Ray, a subprocess or a timeout, so two workers finish sooner than one on 2 cores.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/setup_env.sh")"
export RAY_AUTH_MODE=disabled WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false RAY_USAGE_STATS_ENABLED=0
export TORCHDYNAMO_DISABLE=1   # verl's vocab-parallel entropy wraps a helper in torch.compile; no JIT on CPU CI
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 -n "${STAPO_TEST_WORKERS:-2}" --dist loadscope "$@"
