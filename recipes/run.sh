#!/usr/bin/env bash
# Single driver of all recipes: STAPO, its ablations and the baselines, for every size.
#
#   recipes/run.sh <size> <method> [--dry-run | --print-overrides] [hydra overrides...]
#
#   size     tiny (CPU, recipes/common/cpu.sh) | 1.7b | 8b | 14b
#   method   stapo              loss_mode=stapo (verl's vanilla loss + the S2T token mask)
#            stapo_high_entropy loss_mode=vanilla token_mask=s2t_high_entropy  (the masking ablations;
#            stapo_random       loss_mode=vanilla token_mask=s2t_random         same S2T keys as stapo)
#            stapo_full_mask    loss_mode=vanilla token_mask=s2t_full
#            top_entropy        loss_mode=vanilla token_mask=top_entropy        (20-Entropy baseline)
#            grpo | justrl      verl's vanilla loss, no mask (baselines)
#   --dry-run          compose + validate the config with verl 0.9.1 on this machine (no GPU, Ray,
#                      weights or data needed) and print the key settings; exit non-zero on any error.
#   --print-overrides  print the Hydra overrides, one a line, and exit (no Python for the GPU sizes).
#   Hydra overrides go last and win; the recipe reads only token_mask among them (tiny dump: S2T masks only).
#
# Environment (defaults in recipes/common/base.sh): MODEL_PATH DATA_DIR CKPT_DIR NNODES GPUS_PER_NODE
# PROJECT_NAME EXP_NAME TOTAL_STEPS TOTAL_EPOCHS PRECISION(bf16|fp8) ENGINE(megatron|fsdp) ROLLOUT(tiny: cpu|vllm) ACTOR_TP
# ACTOR_PP ACTOR_CP ROLLOUT_TP PPO_MAX_TOKEN_LEN LOGPROB_MAX_TOKEN_LEN OFFLOAD ROLLOUT_GPU_MEM_UTIL
# STAPO_TAU_P STAPO_Q ... STAPO_VENV (interpreter: $STAPO_VENV/bin/python, else .venv, else python3).
# Multi-node: start Ray first and export RAY_ADDRESS (docs/recipes.md §5); this script never starts Ray.
set -euo pipefail

RECIPES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=recipes/common/base.sh
source "$RECIPES_DIR/common/base.sh"

usage() {
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

if [[ $# -ge 1 && ($1 == -h || $1 == --help) ]]; then
    usage
    exit 0
fi
if [[ $# -lt 2 ]]; then
    usage >&2
    exit 2
fi

SIZE=$1
METHOD=$2
shift 2

MODE=train
EXTRA=()
for arg in "$@"; do
    case $arg in
    --dry-run) MODE=dry-run ;;
    --print-overrides) MODE=print ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) EXTRA+=("$arg") ;;
    esac
done

if [[ $SIZE == tiny ]]; then
    # shellcheck source=recipes/common/cpu.sh
    source "$RECIPES_DIR/common/cpu.sh"
    stapo_cpu_setup "$METHOD"
fi
stapo_build_overrides "$SIZE" "$METHOD" ${EXTRA[@]+"${EXTRA[@]}"}
if [[ $SIZE == tiny ]]; then
    stapo_cpu_overrides
fi
# User overrides go last so they win over the base and the per-size / per-method / platform deltas.
STAPO_OVERRIDES+=(${EXTRA[@]+"${EXTRA[@]}"})

case $MODE in
print)
    printf '%s\n' "${STAPO_OVERRIDES[@]}"
    ;;
dry-run)
    echo "[stapo recipe] dry-run: $SIZE $METHOD engine=$ENGINE precision=$PRECISION nodes=$NNODES x $GPUS_PER_NODE python=$PY" >&2
    exec "$PY" -m stapo_verl.launch.dryrun "${STAPO_OVERRIDES[@]}"
    ;;
train)
    if [[ $SIZE == tiny ]]; then
        stapo_check_ray
        stapo_cpu_train "$METHOD"
        exit $?
    fi
    stapo_check_ray
    # Seconds, before Ray: the driver, GPUs, the route's versions, trackers, paths and the memory plan
    # (stapo_verl/launch/preflight.py); each failure names the value found, the value needed and the fix.
    "$PY" -m stapo_verl.launch.preflight "${STAPO_OVERRIDES[@]}" || exit $?
    stapo_write_generation_config
    # CUDA_DEVICE_MAX_CONNECTIONS is left to verl (constants_ppo.py sets it for Megatron on Hopper).
    exec "$PY" -m verl.trainer.main_ppo "${STAPO_OVERRIDES[@]}"
    ;;
esac
