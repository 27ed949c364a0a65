#!/usr/bin/env bash
# The paper's ablations (its tau_p, q and masking studies) as loops over recipes/run.sh: one training run per point, in sequence.
#
#   recipes/sweeps/sweep.sh <1.7b|8b|14b> <tau_p|q|mask> [--dry-run | --print-overrides] [hydra overrides...]
#
#   tau_p  STAPO_TAU_P over TAU_P_VALUES   (default "0.0002 0.002 0.02 0.2"; v1 swept 2e-3 -> 2e-1)
#   q      STAPO_Q     over Q_VALUES       (default "0.5 0.75 0.8 0.9"; 0.8 = the paper v1's "80 %" reading)
#   mask   the masking variants in MASK_METHODS
#          (default "stapo stapo_high_entropy stapo_random stapo_full_mask"; full_mask = JustRL-FullMask)
#   SWEEP_METHOD   recipe method swept by tau_p / q (default stapo; e.g. stapo_random for the q-vs-random study)
#
# Every point gets its own EXP_NAME (and so its own checkpoint directory). On a cluster, submit points
# as separate jobs instead: e.g. `STAPO_TAU_P=0.02 EXP_NAME=... sbatch recipes/slurm/qwen3_8b_stapo.sbatch`.
set -euo pipefail

RUN="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/run.sh"

if [[ $# -lt 2 ]]; then
    sed -n '4,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
size=$1
kind=$2
shift 2

: "${TAU_P_VALUES:=0.0002 0.002 0.02 0.2}"
: "${Q_VALUES:=0.5 0.75 0.8 0.9}"
: "${MASK_METHODS:=stapo stapo_high_entropy stapo_random stapo_full_mask}"
: "${SWEEP_METHOD:=stapo}"
: "${PRECISION:=bf16}"
prefix="qwen3-$size"

point() {
    # point <method> <exp name> [VAR=value...]: one run.sh invocation with its own EXP_NAME.
    local method=$1 exp=$2
    shift 2
    echo "[stapo sweep] $kind: $method $* EXP_NAME=$exp" >&2
    # With --print-overrides, a marker line separates the points (no Hydra override starts with '#').
    if [[ $PRINT == 1 ]]; then echo "# sweep point $exp"; fi
    env "$@" EXP_NAME="$exp" bash "$RUN" "$size" "$method" ${ARGS[@]+"${ARGS[@]}"}
}

ARGS=("$@")
PRINT=0
for a in "$@"; do [[ $a == --print-overrides ]] && PRINT=1; done
case $kind in
tau_p)
    for v in $TAU_P_VALUES; do point "$SWEEP_METHOD" "$prefix-$SWEEP_METHOD-taup$v-$PRECISION" STAPO_TAU_P="$v"; done
    ;;
q)
    for v in $Q_VALUES; do point "$SWEEP_METHOD" "$prefix-$SWEEP_METHOD-q$v-$PRECISION" STAPO_Q="$v"; done
    ;;
mask)
    for m in $MASK_METHODS; do point "$m" "$prefix-$m-$PRECISION"; done
    ;;
*)
    echo "[stapo sweep] unknown sweep '$kind' (allowed: tau_p q mask)" >&2
    exit 2
    ;;
esac
