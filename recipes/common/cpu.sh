# shellcheck shell=bash
# CPU platform delta of the recipes (sourced by recipes/run.sh for the `tiny` size; not run on its own).
#
# The tiny CPU run is recipes/common/base.sh at size `tiny` plus this file, so every production override
# that a CPU can execute is executed by it: the `dapo` reward manager and the project's scorer, dynamic
# batch size with token budgets, the validation layout (sampled val_kwargs, val_before_train, test_freq),
# the trainer schedule keys (total_training_steps, total_epochs, save_freq, resume_mode), the per-method
# deltas (STAPO short form, GRPO's KL loss and reference model, ...) and the stop-token generation config.
#
# ENGINE=fsdp (default) | megatron selects the training engine (verl's model_engine=dp | megatron).
# ROLLOUT=cpu (default) | vllm selects the rollout: the project's sampler (rollout.name=cpu, below) or verl's own
# vLLM async server on vLLM's CPU build (rollout.name=vllm; its own venv .venv-vllm, from
# `STAPO_VLLM=1 scripts/setup_env.sh`, and its own asset set with head_dim 32 in ~/.cache/stapo_verl/tiny_vllm;
# docs/cpu_backend.md says what of verl's vLLM path runs).
#
# ---------------------------------------------------------------------------------------------------
# What cannot run on a CPU, and what the tiny run uses instead (the one list; docs/cpu_backend.md has
# the same table):
#   vLLM rollout server (async)              -> ROLLOUT=cpu: stapo_verl.cpu rollout server, an HF
#                                               transformers sampler behind verl's RolloutReplica/ServerAdapter
#                                               contract (rollout.name=cpu); reads the same
#                                               engine_kwargs.vllm.generation_config stop setting.
#                                               ROLLOUT=vllm: verl's vLLM server itself, on vLLM's CPU build
#   vLLM engine knobs (gpu_memory_utilization,
#     rollout TP, CUDA graphs, sleep mode)   -> ROLLOUT=cpu: accepted by the config, ignored by the CPU server;
#                                               TP=1. ROLLOUT=vllm: gpu_memory_utilization sizes host memory
#                                               (0.1), eager mode (no CUDA graphs), no sleep mode, TP=1
#   NCCL                                     -> gloo (stapo_verl.cpu platform)
#   CUDA GPUs for verl's resource pools      -> virtual Ray `GPU` resources (ray_init.num_gpus)
#   flash-attention                          -> SDPA (model.override_config.attn_implementation=sdpa)
#   bf16 / FP8 (TE FP8 GEMMs, FP8 rollout,
#     TIS next to FP8)                       -> fp32 on FSDP (PRECISION=fp8 is rejected here)
#   Transformer Engine layer spec            -> Megatron-Core local spec (stapo_verl CPU shims)
#   Megatron-Bridge weight path
#     (vanilla_mbridge=False)                -> default stack: mbridge (vanilla_mbridge=True); engine and loss path
#                                               same. STAPO_STACK=bridge (.venv-bridge, the image's versions):
#                                               Megatron-Bridge itself (stapo_verl.cpu.megatron_shims)
#   Megatron sequence parallelism            -> off (override_transformer_config.sequence_parallel=False)
#   context parallelism (CP > 1)             -> CP = 1
#   param / optimizer offload                -> off (OFFLOAD=0: there is no device memory to free)
#   torch.compile                            -> off
#   gradient checkpointing (FSDP)            -> off (the model is 0.8 M parameters)
#   multi-node Ray, Slurm                    -> one local ray.init (no dashboard); or a cluster started with
#                                               `ray start` (RAY_ADDRESS, NNODES, one virtual GPU a node:
#                                               tests/e2e/test_tiny_two_nodes.py)
#   wandb                                    -> console + verl's `file` logger (metrics.jsonl) + TensorBoard
#                                               (RUN_DIR/tensorboard); LOGGER=[console,file,wandb] logs to wandb
#                                               in offline mode (RUN_DIR/wandb) unless WANDB_MODE is set
#   Qwen3-{1.7,8,14}B-Base, DAPO-Math-17k
#     and the six benchmarks                 -> tiny Qwen3 + synthetic arithmetic from
#                                               python -m stapo_verl.cpu.make_assets (no download)
#   DataLoader worker processes              -> 0 (in-process loading; the data is a few MB in memory,
#                                               and workers only compete for the cores)
# ---------------------------------------------------------------------------------------------------

# stapo_cpu_setup <method>: interpreter, environment, assets and the tiny-run defaults. Call before
# stapo_build_overrides. Sets PY, RUN_NAME, RUN_DIR, ASSETS, MODEL_PATH, TRAIN_FILES, VAL_FILES and the
# CPU defaults of the variables base.sh reads.
stapo_cpu_setup() {
    local method=$1 root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    stapo_cpu_user_env
    # The project's venv: scripts/setup_env.sh creates or updates it (a no-op when its stamp matches setup.cfg).
    # A STAPO_VENV the user chose is used as it is.
    : "${ROLLOUT:=cpu}"
    case $ROLLOUT in
    cpu) local vllm=0 ;;
    vllm) local vllm=1 ;;
    *) stapo_die "ROLLOUT='$ROLLOUT' (allowed: cpu, vllm)" ;;
    esac
    # STAPO_STACK=bridge: the GPU image's stack (.venv-bridge: Python 3.12, torch 2.11, megatron-core 0.18,
    # Megatron-Bridge 0.5.1); ENGINE=megatron then loads weights through verl's default path, Megatron-Bridge.
    : "${STAPO_STACK:=default}"
    case $STAPO_STACK in
    default) ;;
    bridge) [[ $ROLLOUT == cpu ]] || stapo_die "STAPO_STACK=bridge runs ROLLOUT=cpu only (vLLM's CPU build needs torch 2.13)" ;;
    *) stapo_die "STAPO_STACK='$STAPO_STACK' (allowed: default, bridge)" ;;
    esac
    if [[ -z ${STAPO_VENV:-} ]]; then
        STAPO_VENV="$(STAPO_VLLM=$vllm STAPO_STACK=$STAPO_STACK bash "$root/scripts/setup_env.sh" | tail -n 1)"
        export STAPO_VENV
    fi
    stapo_python

    export VERL_PLATFORM=cpu RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
    export RAY_DISABLE_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
    export PYTHONHASHSEED=0
    # TransferQueue's thread pool in this (driver) process; the workers get it through ray_init.runtime_env.
    export TQ_NUM_THREADS=1
    # Ray starts its workers at nice 15 (the raylet's worker_niceness). Beside other CPU-bound work at nice 0 (a CI
    # runner, a laptop's other jobs; here two busy loops on 2 cores) they got almost no CPU: a resumed 2-step tiny run
    # took 15 minutes. The CPU run gives the workers the launcher's priority; a value set before the recipe is kept.
    export RAY_worker_niceness="${RAY_worker_niceness:-0}"

    : "${ENGINE:=fsdp}"
    : "${PRECISION:=bf16}"
    [[ $PRECISION == bf16 ]] ||
        stapo_die "PRECISION=$PRECISION cannot run on CPU (no FP8 kernels; the CPU run trains in fp32): unset PRECISION"
    if [[ $ROLLOUT == cpu ]]; then
        : "${RUN_NAME:=tiny_cpu_${method}}"
    else
        : "${RUN_NAME:=tiny_cpu_${method}_${ROLLOUT}}"
    fi
    : "${PROJECT_NAME:=stapo_tiny_cpu}"
    : "${EXP_NAME:=$RUN_NAME}"
    : "${LOGGER:=[console,file,tensorboard]}"
    : "${NNODES:=1}"
    : "${DATALOADER_WORKERS:=0}"
    RUN_DIR="${STAPO_RUN_DIR:-$root/outputs/$RUN_NAME}"
    # Absolute (the Ray workers run elsewhere); created only when training starts.
    [[ $RUN_DIR == /* ]] || RUN_DIR="$PWD/$RUN_DIR"
    : "${CKPT_PATH:=$RUN_DIR/ckpt}"
    export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics.jsonl"
    # verl's TensorBoard and wandb trackers write where these say (read in the TaskRunner, hence the runtime env)
    export TENSORBOARD_DIR="${TENSORBOARD_DIR:-$RUN_DIR/tensorboard}" WANDB_DIR="${WANDB_DIR:-$RUN_DIR}"
    if [[ $LOGGER == *wandb* ]]; then
        export WANDB_MODE="${WANDB_MODE:-offline}"
    else
        export WANDB_MODE=disabled
    fi
    case $ENGINE in
    fsdp) stapo_cpu_fsdp defaults ;;
    megatron) stapo_cpu_megatron defaults ;;
    *) stapo_die "ENGINE='$ENGINE' (allowed: ${STAPO_ENGINES[*]})" ;;
    esac

    # vLLM's CPU attention has no kernel for the default head size 24 (stapo_verl.cpu.make_assets.VLLM_HEAD_DIM).
    local asset_args=()
    if [[ $ROLLOUT == vllm ]]; then
        # On the CPU platform vLLM sizes its KV cache from host memory (gpu_memory_utilization): 0.92 of it is
        # refused on a 24 GiB machine that also holds the trainer; 0.1 holds far more than the tiny batch needs.
        : "${ROLLOUT_GPU_MEM_UTIL:=0.1}"
        ASSETS="${STAPO_ASSETS:-$HOME/.cache/stapo_verl/tiny_vllm}"
        asset_args=(--head-dim 32)
    else
        ASSETS="${STAPO_ASSETS:-$HOME/.cache/stapo_verl/tiny}"
    fi
    # Progress on stderr; stdout is the three values read below (so --print-overrides' stdout stays the list).
    local assets make_assets=(-m stapo_verl.cpu.make_assets --out "$ASSETS" ${asset_args[@]+"${asset_args[@]}"})
    assets="$("$PY" "${make_assets[@]}" --print-recipe-vars)" ||
        stapo_die "building the tiny assets in $ASSETS failed (python ${make_assets[*]})"
    # shellcheck disable=SC2034  # read by recipes/common/base.sh
    {
        read -r MODEL_PATH
        read -r TRAIN_FILES
        read -r VAL_FILES
    } <<<"$assets"
}

# stapo_cpu_overrides: the CPU platform delta, appended after the base / size / method overrides.
stapo_cpu_overrides() {
    STAPO_OVERRIDES+=(
        # Platform: CPU device; what every Ray worker needs travels in ray_init.runtime_env (also to the nodes of
        # a cluster this recipe did not start).
        trainer.device=cpu
        +ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu
        +ray_kwargs.ray_init.runtime_env.env_vars.RAY_AUTH_MODE=disabled
        "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE='$WANDB_MODE'"
        "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_DIR='$WANDB_DIR'"
        "+ray_kwargs.ray_init.runtime_env.env_vars.TENSORBOARD_DIR='$TENSORBOARD_DIR'"
        "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH='$VERL_FILE_LOGGER_PATH'"
        # On 2 shared cores intra-op thread spinning made torch an order of magnitude slower.
        "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='1'"
        "+ray_kwargs.ray_init.runtime_env.env_vars.STAPO_CPU_ROLLOUT_THREADS='1'"
        # TransferQueue sizes its put/get thread pool from TQ_NUM_THREADS (default 8) and warns on every call
        # when that exceeds the physical cores (hundreds of lines a run on 2 cores).
        "+ray_kwargs.ray_init.runtime_env.env_vars.TQ_NUM_THREADS='1'"
        transfer_queue.backend.SimpleStorage.num_data_storage_units=1
        # One agent-loop worker, one reward worker.
        actor_rollout_ref.rollout.agent.num_workers=1
        reward.num_workers=1
        # Model: SDPA attention, no gradient checkpointing.
        +actor_rollout_ref.model.override_config.attn_implementation=sdpa
        actor_rollout_ref.model.enable_gradient_checkpointing=False
        "data.dataloader_num_workers=$DATALOADER_WORKERS"
        # Validation generations (verl's dump): the report's standard errors come from them.
        "trainer.validation_data_dir='$RUN_DIR/val_generations'"
        # Hydra's output (the composed config in .hydra/, main_ppo.log) in the run dir, not ./outputs/<date>.
        "hydra.run.dir='$RUN_DIR/hydra'"
    )
    if [[ -z ${RAY_ADDRESS:-} ]]; then
        # A local Ray started by main_ppo: virtual GPUs for verl's resource pools, no dashboard. A cluster started
        # with `ray start` (RAY_ADDRESS) declares its own CPUs and GPUs (ray.init refuses them when connecting).
        STAPO_OVERRIDES+=(
            "+ray_kwargs.ray_init.num_gpus=$GPUS_PER_NODE"
            ray_kwargs.ray_init.num_cpus=8
            +ray_kwargs.ray_init.include_dashboard=False
        )
    fi
    case $ENGINE in
    fsdp) stapo_cpu_fsdp overrides ;;
    megatron) stapo_cpu_megatron overrides ;;
    esac
    stapo_cpu_rollout
}

# stapo_cpu_rollout: the rollout of ROLLOUT (set by stapo_cpu_setup).
stapo_cpu_rollout() {
    case $ROLLOUT in
    cpu)
        # The project's CPU server instead of vLLM.
        STAPO_OVERRIDES+=(actor_rollout_ref.rollout.name=cpu)
        ;;
    vllm)
        STAPO_OVERRIDES+=(
            actor_rollout_ref.rollout.name=vllm
            # The rollout computes in the actor's fp32 (the FSDP actor trains in fp32 here): the rollout/actor
            # log-prob comparison (training/rollout_probs_diff_*, rollout_corr/*) then shows the weight sync, not bf16.
            actor_rollout_ref.rollout.dtype=float32
            # No CUDA graphs to capture; eager also skips torch.compile of the model (minutes on 2 cores).
            actor_rollout_ref.rollout.enforce_eager=True
            # Sleep mode frees GPU memory through CUDA's allocator (cumem); vLLM refuses it on the CPU platform.
            +actor_rollout_ref.rollout.enable_sleep_mode=False
            actor_rollout_ref.rollout.free_cache_engine=False
        )
        ;;
    esac
}

# stapo_cpu_fsdp defaults|overrides: FSDP2 on gloo in fp32, one virtual GPU.
stapo_cpu_fsdp() {
    case $1 in
    defaults)
        : "${GPUS_PER_NODE:=1}"
        ;;
    overrides)
        STAPO_OVERRIDES+=(
            actor_rollout_ref.actor.use_torch_compile=False
            actor_rollout_ref.actor.fsdp_config.use_torch_compile=False
            actor_rollout_ref.actor.fsdp_config.model_dtype=fp32
            "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
            actor_rollout_ref.ref.fsdp_config.model_dtype=fp32
            # the reference model (GRPO's KL loss) would otherwise compute in bf16: at step 1 it is the policy,
            # and its KL must read ~0, not bf16 rounding (and TransferQueue rejects a bf16 log-prob field)
            "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
        )
        ;;
    esac
}

# >>> megatron on cpu
# stapo_cpu_megatron defaults|overrides: verl's Megatron engine at TP=2 over 2 virtual GPUs (gloo), on
# the mbridge weight path with Megatron-Core's local layer spec (stapo_verl's CPU shims replace TE and
# the CUDA-only call sites; loaded only when VERL_PLATFORM=cpu). It trains in bf16 (McoreEngineConfig
# accepts bf16/fp16 only) with base.sh's distributed optimizer and full recompute; the fp32 parity
# checks are tests/test_megatron_engine_on_cpu.py.
stapo_cpu_megatron() {
    case $1 in
    defaults)
        : "${GPUS_PER_NODE:=2}"
        : "${ACTOR_TP:=2}"
        ;;
    overrides)
        STAPO_OVERRIDES+=(actor_rollout_ref.actor.megatron.use_mbridge=True)
        if [[ $STAPO_STACK == bridge ]]; then
            # verl's default weight path (Megatron-Bridge), as on GPUs; the local spec's norm cannot run sequence
            # parallelism, which the recipe turns on for TP > 1.
            STAPO_OVERRIDES+=(
                actor_rollout_ref.actor.megatron.vanilla_mbridge=False
                actor_rollout_ref.actor.megatron.sequence_parallel=False
            )
        else
            STAPO_OVERRIDES+=(
                # The default stack (megatron-core 0.16.1) has no Megatron-Bridge; mbridge converts the same weights.
                actor_rollout_ref.actor.megatron.vanilla_mbridge=True
                # mbridge turns sequence parallelism on whenever TP > 1; the local spec's norm cannot run it.
                +actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel=False
            )
        fi
        ;;
    esac
}
# <<< megatron on cpu

# stapo_cpu_user_env: the recipe variables (every NAME the recipe files read as ${NAME:-...} / ${NAME:=...}, and
# STAPO_VENV) that the caller's environment sets, before the recipe sets any: STAPO_CPU_USER_ENV=(NAME=value ...),
# shell-quoted. The resume hint repeats them.
stapo_cpu_user_env() {
    local name names
    STAPO_CPU_USER_ENV=()
    names=$(grep -ohE '\$\{[A-Za-z][A-Za-z0-9_]*:[-=]' "$RECIPES_DIR"/common/*.sh | sed -E 's/^\$\{//; s/:.$//' | sort -u)
    for name in $names STAPO_VENV; do
        [[ $name == STAPO_RUN_DIR || $name == SLURM_* ]] && continue
        if printenv "$name" >/dev/null; then
            STAPO_CPU_USER_ENV+=("$name=$(printf '%q' "${!name}")")
        fi
    done
}

# stapo_cpu_command <method>: the command that runs this tiny run again, as the user types it (for the messages:
# the stop's resume hint, "already complete"): STAPO_RUN_DIR=<the run dir>, the recipe variables the caller set
# (stapo_cpu_user_env), the recipe (relative to the working directory when that is the checkout) and the Hydra
# overrides, each shell-quoted, so that running it literally resumes this run.
stapo_cpu_command() {
    local root script words=()
    root="$(cd "$RECIPES_DIR/.." && pwd)"
    if [[ -f $RECIPES_DIR/tiny_cpu_$1.sh ]]; then
        script="recipes/tiny_cpu_$1.sh"
    else
        script="recipes/run.sh tiny $1"
    fi
    [[ $PWD == "$root" ]] || script="$root/$script"
    words=("STAPO_RUN_DIR=$(printf '%q' "$RUN_DIR")" ${STAPO_CPU_USER_ENV[@]+"${STAPO_CPU_USER_ENV[@]}"} bash "$script")
    local arg
    for arg in ${EXTRA[@]+"${EXTRA[@]}"}; do
        words+=("$(printf '%q' "$arg")")
    done
    echo "${words[*]}"
}

# stapo_cpu_wait_through_stop: SIGINT/SIGTERM (Ctrl-C, Slurm's stop) reach every process of the group; the launcher
# and the console handle them (the launcher shuts Ray down and prints where the run resumes), so the shell waits for
# the pipeline instead of dying first. A handler, not '' (ignored signals would stay ignored in the children).
stapo_cpu_wait_through_stop() {
    STAPO_STOPPED=
    trap 'STAPO_STOPPED=SIGINT' INT
    trap 'STAPO_STOPPED=SIGTERM' TERM
}

# stapo_cpu_train <method>: train with STAPO_OVERRIDES, log, then post-process.
#
# python -m stapo_verl.launch.train composes STAPO_OVERRIDES with verl's config (Hydra) and says whether verl would
# train anything: when the checkpoint verl resumes from is already at the run's last step, it says so and nothing
# is run (exit 3). Otherwise it writes the stop-token generation config, keeps an earlier metrics.jsonl, and runs
# verl.trainer.main_ppo in the same process (verl is imported once). Its whole output is appended to
# $RUN_DIR/train.log; the terminal shows one line per step, errors and the summary (python -m
# stapo_verl.launch.console; STAPO_CONSOLE=full shows everything).
stapo_cpu_train() {
    local method=$1 rc start end wall
    local train=("$PY" -m stapo_verl.launch.train --run-dir "$RUN_DIR" --command "$(stapo_cpu_command "$method")")
    if stapo_is_true "$STOP_AT_END_OF_TURN"; then
        train+=(--stop-tokens "$MODEL_PATH" "$GEN_CONFIG_DIR")
    fi
    train+=(-- "${STAPO_OVERRIDES[@]}")
    mkdir -p "$RUN_DIR"
    start=$(date +%s)
    set +e
    stapo_cpu_wait_through_stop
    if [[ ${STAPO_CONSOLE:-} == full ]]; then
        "${train[@]}" 2>&1 | tee -a "$RUN_DIR/train.log"
    else
        # the shell's own job note ("Aborted", "Terminated") when Ray's processes, ending on a stop, take the
        # launcher's Ray client with them is written to this group's stderr: the log, not the terminal (fd 3 keeps
        # the terminal for the console's own errors). Both append to the log and neither reads it (SC2094 is about
        # reading and writing one file in a pipeline).
        # shellcheck disable=SC2094
        { ("${train[@]}" 2>&1) 2>&1 | "$PY" -m stapo_verl.launch.console --log "$RUN_DIR/train.log" 2>&3; } \
            3>&2 2>>"$RUN_DIR/train.log"
    fi
    rc=${PIPESTATUS[0]}
    trap - INT TERM
    set -e
    case $rc in
    3) return 0 ;; # already complete: nothing was run
    130 | 143) return "$rc" ;; # stopped by SIGINT / SIGTERM: the launcher said where the run resumes
    2) stapo_die "nothing was started: the config, the data or the verl is wrong (the line above names the fix)" ;;
    esac
    if [[ -n $STAPO_STOPPED ]]; then # the launcher ended before it could say so (Ray's processes went first)
        "$PY" -m stapo_verl.launch.train --run-dir "$RUN_DIR" --command "$(stapo_cpu_command "$method")" \
            --after-stop "$STAPO_STOPPED" --started-at "$start" -- "${STAPO_OVERRIDES[@]}" 2>>"$RUN_DIR/train.log"
        return $?
    fi
    end=$(date +%s)
    wall=$((end - start))
    echo "{\"wall_seconds\": $wall, \"returncode\": $rc}" >"$RUN_DIR/wall.json"
    if ((rc != 0)); then
        echo "[stapo recipe] main_ppo failed (exit $rc); the end of $RUN_DIR/train.log (without Python warnings):" >&2
        "$PY" -m stapo_verl.launch.console --log "$RUN_DIR/train.log" --tail 40 >&2 || tail -n 40 "$RUN_DIR/train.log" >&2
    fi
    if [[ -s $RUN_DIR/metrics.jsonl ]]; then
        "$PY" -m stapo_verl.plots report --run "$RUN_DIR" --wall-seconds "$wall" || echo "[stapo recipe] report failed" >&2
    fi
    return "$rc"
}
