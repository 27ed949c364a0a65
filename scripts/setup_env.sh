#!/usr/bin/env bash
# Create (if missing) and fill the project's virtual environment: CPU torch first, then verl 0.9.1 without
# extras (its extras pin a CUDA torch), then this package. Idempotent; prints the venv path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${STAPO_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.stapo_installed"
HASH="$(cat "$ROOT/setup.cfg" | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/pip" install -q "torch==2.13.0"
  "$VENV/bin/pip" install -q -e "$ROOT[test,megatron]"
  echo "$HASH" > "$STAMP"
fi
echo "$VENV"
