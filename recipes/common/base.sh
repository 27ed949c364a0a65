# shellcheck shell=bash
# Shared base of every STAPO / baseline recipe (sourced by recipes/run.sh; not run on its own).
#
# One place for the paper's training setup (arXiv 2602.15620 §4, which follows JustRL), the per-size deltas
# (TP/PP, token budgets, offload; sized for 8 x 80 GB H100 per node, justified in docs/recipes.md), the
# per-method deltas (STAPO, its masking ablations, GRPO, 20-Entropy, JustRL; docs/recipes.md), the engine
# switch (ENGINE=megatron|fsdp) and the precision switch (PRECISION=bf16|fp8). Everything is a Hydra
# override of verl 0.9.1's ppo_trainer config, so `--dry-run` validates exactly what
# `python -m verl.trainer.main_ppo` would receive.
#
# The `tiny` size is the CPU run (recipes/tiny_cpu_*.sh): the same base and per-method deltas, plus the
# CPU platform delta of recipes/common/cpu.sh (what cannot run on a CPU is listed there, once).
#
# Every default below can be changed with the environment variable of the same name; anything else
# is changed with trailing Hydra overrides (they are appended last, so they win). A key that the base
# adds with `+key=value` is overridden by passing `key=value` (without the `+`).

# ---------------------------------------------------------------------------------------------------
# Allowed values (checked before anything runs, so a typo fails fast with the list).
STAPO_SIZES=(tiny 1.7b 8b 14b)
STAPO_METHODS=(stapo stapo_high_entropy stapo_random stapo_full_mask grpo top_entropy justrl)
# The methods that are verl's vanilla loss plus one of the plugin's policy token masks
# (actor_rollout_ref.actor.policy_loss.token_mask); `stapo` is loss_mode=stapo, i.e. vanilla + s2t.
declare -A STAPO_METHOD_MASK=(
    [stapo_high_entropy]=s2t_high_entropy
    [stapo_random]=s2t_random
    [stapo_full_mask]=s2t_full
    [top_entropy]=top_entropy
)
# The plugin's S2T-family masks (stapo_verl.core.masks.S2T_TOKEN_MASKS; a unit test keeps the two equal): the ones
# the silenced-token dump (policy_loss.dump_tokens) works with.
STAPO_S2T_MASKS=(s2t s2t_high_entropy s2t_random s2t_full)
STAPO_PRECISIONS=(bf16 fp8)
STAPO_ENGINES=(megatron fsdp)

stapo_die() {
    echo "[stapo recipe] ERROR: $*" >&2
    exit 2
}

stapo_in_list() {
    # stapo_in_list <value> <item>...: 0 if value is one of the items.
    local v=$1
    shift
    local x
    for x in "$@"; do [[ $x == "$v" ]] && return 0; done
    return 1
}

stapo_is_true() {
    case ${1,,} in 1 | true | yes | on) return 0 ;; *) return 1 ;; esac
}

# ---------------------------------------------------------------------------------------------------
# Per-size deltas. Only what differs between sizes lives here; memory estimates in docs/recipes.md §3.
#   ACTOR_TP/PP/CP        Megatron tensor/pipeline/context parallel sizes of the actor (and ref).
#   ROLLOUT_TP            vLLM tensor parallel size.
#   PPO_MAX_TOKEN_LEN     dynamic-batch token budget per GPU of the training forward/backward.
#   LOGPROB_MAX_TOKEN_LEN token budget per GPU of the no-grad old/ref log-prob passes.
#   OFFLOAD               1: Megatron params+grads and optimizer states leave the GPU during rollout.
#   ROLLOUT_GPU_MEM_UTIL  vLLM's share of each GPU (weights + KV cache) while it is awake.
# The tiny size also sets the paper-scale knobs of stapo_env_defaults (data, batch, steps, lr, n,
# validation, tau_p) and may append size-only overrides to STAPO_SIZE_OVERRIDES.
stapo_size_defaults() {
    local size=$1
    STAPO_SIZE_OVERRIDES=()
    case $size in
    tiny)
        # >>> tiny size
        # The CPU run: tiny Qwen3 and synthetic arithmetic from stapo_verl.cpu.make_assets
        # (MODEL_PATH / TRAIN_FILES / VAL_FILES come from its assets.json, read in recipes/common/cpu.sh).
        # Its warm start knows the answers (greedy validation accuracy ~1.0) but samples stray tokens at
        # T = 1 (sampled accuracy ~0.55); RL removes most of them within ~10 steps (docs/cpu_backend.md).
        : "${ACTOR_TP:=1}" "${ACTOR_PP:=1}" "${ACTOR_CP:=1}" "${ROLLOUT_TP:=1}"
        : "${OFFLOAD:=0}" "${ROLLOUT_GPU_MEM_UTIL:=0.5}"
        # 16 prompts x n = 8, one optimizer step per RL step, prompt <= 128 / response <= 40 tokens.
        : "${TRAIN_BATCH_SIZE:=16}" "${PPO_MINI_BATCH_SIZE:=16}" "${ROLLOUT_N:=8}"
        : "${MAX_PROMPT_LEN:=128}" "${MAX_RESPONSE_LEN:=40}"
        # Dynamic-batch budgets: 4 (train) / 8 (log-prob) full-length sequences a micro-batch (about 13 / 26 of the
        # ~52-token sequences the run writes). Small on purpose: without flash-attention's varlen kernels verl's
        # packed (remove-padding) micro-batch goes through SDPA with a dense block-diagonal mask, so attention costs
        # the square of the micro-batch's tokens. At 5,376 / 10,752 a step's old_log_prob took 2.6 s and its update
        # 3.8 s; at 672 / 1,344, 0.9 s and 1.6 s (docs/results.md). The loss does not depend on the split.
        : "${PPO_MAX_TOKEN_LEN:=672}" "${LOGPROB_MAX_TOKEN_LEN:=1344}"
        # 20 steps, validation before, at 10 and at 20; one checkpoint, at the end.
        : "${TOTAL_STEPS:=20}" "${TEST_FREQ:=10}" "${SAVE_FREQ:=20}" "${VAL_BEFORE_TRAIN:=True}"
        # lr 2e-4: at 4e-4 the fast removal of stray tokens also broke arithmetic the warm start knew
        # (validation +2.6 to +15.9 points over 4 runs, by seed); 1e-3 collapsed (0.52 -> 0.19 in 5 steps).
        : "${LR:=2e-4}" "${LR_WARMUP_STEPS:=0}"
        # Validation sampled at the training temperature (the accuracy the RL objective moves), one sample
        # per row of the 640 synthetic validation rows: independent samples, standard error <= 2.0 points.
        : "${VAL_N:=1}" "${VAL_TEMPERATURE:=1.0}" "${VAL_TOP_P:=1.0}"
        # tau_p = 0.1, not the paper's 0.002 (docs/cpu_backend.md): this 368-token policy is sharpened by
        # RL within ~10 steps, after which about one positive-advantage token a step is below 0.002; at
        # 0.1 STAPO also acts on the low-probability digits of answers that are still right.
        : "${STAPO_TAU_P:=0.1}"
        # Same seed, same run (docs/results.md): per-request rollout seeds and the canonical batch order
        # (+trainer.reproducible, REPRODUCIBLE below, on by default), and the CPU rollout server is batch-invariant,
        # so two runs of one command give the same metrics.
        : "${FULL_DETERMINISM:=True}"
        STAPO_SIZE_OVERRIDES+=(
            data.seed=1
            # Prompt lengths: every synthetic prompt fits data.max_prompt_length (make_assets builds them so), and the
            # launcher counts every prompt's tokens before Ray (stapo_verl/launch/data_checks.py), so verl's own
            # filter pass (a datasets.filter over every row at start-up) is off. A longer prompt (your own data) then
            # stops the run before Ray, naming the fixes; it is never truncated silently. verl's agent loop would
            # left-truncate it whatever data.truncation says; truncation=error says the run does not ask for that.
            data.truncation=error
            data.filter_overlong_prompts=False
            actor_rollout_ref.rollout.calculate_log_probs=True
            trainer.max_actor_ckpt_to_keep=2
        )
        # The silenced-token dump (stapo_verl/minibatch/token_dump.py) is on for the S2T methods of the tiny run, as
        # long as the run's mask is an S2T mask (a user override token_mask=<your mask> turns it off: the dump
        # records S2T candidates). `method` and `token_mask` are stapo_build_overrides' locals (bash scoping).
        # STAPO_DUMP_TOKENS=0 turns it off.
        if stapo_is_true "${STAPO_DUMP_TOKENS:-1}" && [[ ${method:-} == stapo* ]] &&
            stapo_in_list "${token_mask:-}" "${STAPO_S2T_MASKS[@]}"; then
            STAPO_SIZE_OVERRIDES+=(actor_rollout_ref.actor.policy_loss.dump_tokens=True)
        fi
        # <<< tiny size
        ;;
    1.7b)
        : "${MODEL_PATH:=Qwen/Qwen3-1.7B-Base}"
        : "${ACTOR_TP:=1}" "${ACTOR_PP:=1}" "${ACTOR_CP:=1}" "${ROLLOUT_TP:=1}"
        : "${PPO_MAX_TOKEN_LEN:=32768}" "${LOGPROB_MAX_TOKEN_LEN:=32768}"
        : "${OFFLOAD:=0}" "${ROLLOUT_GPU_MEM_UTIL:=0.5}"
        ;;
    8b)
        : "${MODEL_PATH:=Qwen/Qwen3-8B-Base}"
        : "${ACTOR_TP:=2}" "${ACTOR_PP:=1}" "${ACTOR_CP:=1}" "${ROLLOUT_TP:=2}"
        : "${PPO_MAX_TOKEN_LEN:=32768}" "${LOGPROB_MAX_TOKEN_LEN:=65536}"
        : "${OFFLOAD:=1}" "${ROLLOUT_GPU_MEM_UTIL:=0.6}"
        ;;
    14b)
        : "${MODEL_PATH:=Qwen/Qwen3-14B-Base}"
        : "${ACTOR_TP:=4}" "${ACTOR_PP:=1}" "${ACTOR_CP:=1}" "${ROLLOUT_TP:=2}"
        : "${PPO_MAX_TOKEN_LEN:=32768}" "${LOGPROB_MAX_TOKEN_LEN:=65536}"
        : "${OFFLOAD:=1}" "${ROLLOUT_GPU_MEM_UTIL:=0.6}"
        ;;
    *) stapo_die "unknown size '$size' (allowed: ${STAPO_SIZES[*]})" ;;
    esac
}

# ---------------------------------------------------------------------------------------------------
# Environment defaults shared by all sizes (call after stapo_size_defaults).
stapo_env_defaults() {
    local size=$1 method=$2
    # Slurm exports the node count; outside Slurm the default is one node.
    : "${NNODES:=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}}"
    : "${GPUS_PER_NODE:=8}"
    : "${ENGINE:=megatron}"
    : "${DATA_DIR:=$HOME/data/stapo}"
    : "${CKPT_DIR:=$HOME/checkpoints}"
    : "${PRECISION:=bf16}"
    : "${PROJECT_NAME:=stapo}"
    : "${EXP_NAME:=qwen3-${size}-${method}-${PRECISION}}"
    : "${CKPT_PATH:=$CKPT_DIR/$PROJECT_NAME/$EXP_NAME}"
    # Data: DAPO-Math-17k, 256 prompts a step, 1k prompt / 15k response (the paper's setup).
    local d=$DATA_DIR
    [[ -n ${TRAIN_FILES:-} ]] || TRAIN_FILES="'$d/dapo-math-17k.parquet'"
    [[ -n ${VAL_FILES:-} ]] ||
        VAL_FILES="['$d/aime24.parquet','$d/aime25.parquet','$d/amc23.parquet','$d/math500.parquet','$d/minerva.parquet','$d/olympiadbench.parquet']"
    : "${TRAIN_BATCH_SIZE:=256}" "${PPO_MINI_BATCH_SIZE:=64}" "${ROLLOUT_N:=8}"
    : "${MAX_PROMPT_LEN:=1024}" "${MAX_RESPONSE_LEN:=15360}"
    # verl's rollout.full_determinism: per-request vLLM seeds from the plugin, VLLM_BATCH_INVARIANT=1 and
    # deterministic NCCL in the rollout (slower; docs/recipes.md says what is and is not reproducible on GPUs).
    : "${FULL_DETERMINISM:=False}"
    # Same seed, same run for any verl job (+trainer.reproducible, the plugin's switch; docs/design.md §3a):
    # per-request rollout seeds and the training batch in prompt-submission order instead of finishing order.
    # Its cost on a GPU (vLLM's per-request seeded sampling) is unknown until measured; REPRODUCIBLE=False drops it.
    : "${REPRODUCIBLE:=True}"
    : "${LR:=1e-6}" "${LR_WARMUP_STEPS:=10}"
    # The paper gives no step count (its curves go past 3,000 steps) and the raw DAPO-Math-17k parquet is
    # ~100x duplicated, so the run length is set in steps, not epochs.
    : "${TOTAL_STEPS:=3000}"
    # verl's loop also stops at trainer.total_epochs (default 30: 30 x 67 = 2,010 steps on the
    # deduplicated 17,188 rows). Every epoch has >= 1 step, so TOTAL_STEPS epochs never bind first;
    # --dry-run checks total_epochs x floor(rows / train_batch_size) against the parquet's row count.
    : "${TOTAL_EPOCHS:=$TOTAL_STEPS}"
    : "${TEST_FREQ:=20}"
    : "${SAVE_FREQ:=100}"
    : "${VAL_BEFORE_TRAIN:=True}"
    # The paper's "training-aligned" decoding (T=1.0, top-p 1.0). verl has one n for all validation
    # files, so in-training validation uses avg@4 everywhere; the avg@32 numbers for AIME/AMC come
    # from the offline evaluation (stapo_verl.eval). JustRL setting: VAL_TEMPERATURE=0.7 VAL_TOP_P=0.9.
    : "${VAL_N:=4}" "${VAL_TEMPERATURE:=1.0}" "${VAL_TOP_P:=1.0}"
    : "${LOGGER:=['console','wandb']}"
    # STAPO hyperparameters (the paper's tau_p = 0.002, q = 0.75) and ablation knobs.
    # STAPO_STATS_SOURCE: old_policy (verl's old-log-prob pass) | current_minibatch (one extra no-grad forward
    # per optimizer mini-batch, the paper's Algorithm 1).
    : "${STAPO_TAU_P:=0.002}" "${STAPO_Q:=0.75}" "${STAPO_STATS_SOURCE:=old_policy}"
    : "${TOP_ENTROPY_RATIO:=0.2}"
    # GRPO baseline KL coefficient: the paper does not give it; 0.001 is verl's GRPO example value.
    : "${GRPO_KL_COEF:=0.001}"
    # FP8 knobs (only read when PRECISION=fp8). verl docs/low_precision/fp8.md: hybrid + blockwise
    # on Hopper, token-level TIS with C=2 next to FP8 rollout.
    : "${FP8_FORMAT:=hybrid}" "${FP8_RECIPE:=blockwise}" "${TIS_THRESHOLD:=2.0}"
    : "${DIST_CKPT_PATH:=}"
    # Stop tokens: vLLM stops at the eos ids of the generation config it loads. Qwen3 base models list
    # only <|endoftext|> there while their chat template ends a turn with <|im_end|>, so the recipe
    # points vLLM's `generation_config` engine arg at a copy that lists both (stapo_verl/stop_tokens.py
    # writes it at launch, from the model's own tokenizer/generation config). STOP_AT_END_OF_TURN=0:
    # use the model's generation config as is.
    : "${STOP_AT_END_OF_TURN:=1}" "${GEN_CONFIG_DIR:=$CKPT_PATH/generation_config}"
    stapo_in_list "$PRECISION" "${STAPO_PRECISIONS[@]}" ||
        stapo_die "PRECISION='$PRECISION' (allowed: ${STAPO_PRECISIONS[*]})"
    stapo_in_list "$ENGINE" "${STAPO_ENGINES[@]}" || stapo_die "ENGINE='$ENGINE' (allowed: ${STAPO_ENGINES[*]})"
    if [[ $ENGINE == fsdp && $size != tiny ]]; then
        stapo_die "ENGINE=fsdp is only set up for the tiny CPU size; size '$size' is sized for Megatron (docs/recipes.md §3)"
    fi
    stapo_python
}

# ---------------------------------------------------------------------------------------------------
# The interpreter: one variable, STAPO_VENV (as scripts/setup_env.sh). Unset: the checkout's .venv when
# present, else the image's / cluster's python3. Sets PY.
stapo_python() {
    local repo_root
    repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    if [[ -n ${STAPO_VENV:-} ]]; then
        [[ -x $STAPO_VENV/bin/python ]] ||
            stapo_die "STAPO_VENV='$STAPO_VENV' has no bin/python (create it with: STAPO_VENV='$STAPO_VENV' bash scripts/setup_env.sh)"
        PY="$STAPO_VENV/bin/python"
    elif [[ -x $repo_root/.venv/bin/python ]]; then
        PY="$repo_root/.venv/bin/python"
    else
        PY=python3
    fi
}

# ---------------------------------------------------------------------------------------------------
# Settings the driver's environment holds for the Ray workers. verl's ray.init(runtime_env=...) applies
# to every task and actor of the job, also on a cluster started earlier by `ray start` (whose raylets
# never saw this shell's environment). Forwarded only when set, so the worker-side defaults apply
# otherwise (stapo_verl/rewards/timeout.py).
# STAPO_AUDIT_DIR: each process records there the plugin wrappers that acted (stapo_verl/integration/verl_0_9_1/job.py)
STAPO_FORWARDED_ENV=(STAPO_REWARD_TIMEOUT_S STAPO_REWARD_WORKERS STAPO_AUDIT_DIR)
stapo_forward_env() {
    local v
    for v in "${STAPO_FORWARDED_ENV[@]}"; do
        if [[ -n ${!v:-} ]]; then
            STAPO_OVERRIDES+=("+ray_kwargs.ray_init.runtime_env.env_vars.$v='${!v}'")
        fi
    done
}

# ---------------------------------------------------------------------------------------------------
# The paper's setup (JustRL's recipe plus S2T). Appends to the global array STAPO_OVERRIDES.
stapo_base_overrides() {
    STAPO_OVERRIDES+=(
        # GRPO advantage, G = 8, no KL anywhere, no entropy bonus (the paper's objective has neither).
        algorithm.adv_estimator=grpo
        algorithm.norm_adv_by_std_in_grpo=True
        algorithm.use_kl_in_reward=False
        # Data (DAPO-Math-17k and the six benchmarks on the GPU sizes).
        "data.train_files=$TRAIN_FILES"
        "data.val_files=$VAL_FILES"
        "data.train_batch_size=$TRAIN_BATCH_SIZE"
        "data.max_prompt_length=$MAX_PROMPT_LEN"
        "data.max_response_length=$MAX_RESPONSE_LEN"
        data.filter_overlong_prompts=True
        data.truncation=error
        data.shuffle=True
        "actor_rollout_ref.model.path='$MODEL_PATH'"
        actor_rollout_ref.model.use_remove_padding=True
        # Optimizer: AdamW, lr 1e-6 constant after 10 warm-up steps; weight decay 0.1 and gradient clip 1.0 are
        # not listed by the paper and taken from JustRL.
        "actor_rollout_ref.actor.optim.lr=$LR"
        "actor_rollout_ref.actor.optim.lr_warmup_steps=$LR_WARMUP_STEPS"
        actor_rollout_ref.actor.optim.weight_decay=0.1
        actor_rollout_ref.actor.optim.clip_grad=1.0
        # Batches: mini-batch 64 prompts (4 optimizer steps a rollout batch), 1 epoch, dynamic bsz.
        "actor_rollout_ref.actor.ppo_mini_batch_size=$PPO_MINI_BATCH_SIZE"
        actor_rollout_ref.actor.ppo_epochs=1
        actor_rollout_ref.actor.use_dynamic_bsz=True
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$PPO_MAX_TOKEN_LEN"
        # Clip-higher 0.2/0.28, token-mean; dual clip c = 10 (not listed by the paper; JustRL's value).
        actor_rollout_ref.actor.clip_ratio_low=0.2
        actor_rollout_ref.actor.clip_ratio_high=0.28
        actor_rollout_ref.actor.clip_ratio_c=10.0
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.use_kl_loss=False
        # vLLM rollout, async server mode, n = 8, T = 1.0, top-p 1.0.
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.mode=async
        "actor_rollout_ref.rollout.n=$ROLLOUT_N"
        "actor_rollout_ref.rollout.full_determinism=$FULL_DETERMINISM"
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.top_p=1.0
        actor_rollout_ref.rollout.top_k=-1
        "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
        "actor_rollout_ref.rollout.gpu_memory_utilization=$ROLLOUT_GPU_MEM_UTIL"
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$LOGPROB_MAX_TOKEN_LEN"
        # Validation on the six benchmarks, sampled; verl's default is greedy n = 1.
        actor_rollout_ref.rollout.val_kwargs.do_sample=True
        "actor_rollout_ref.rollout.val_kwargs.n=$VAL_N"
        "actor_rollout_ref.rollout.val_kwargs.temperature=$VAL_TEMPERATURE"
        "actor_rollout_ref.rollout.val_kwargs.top_p=$VAL_TOP_P"
        # Reward: DAPO manager (overlong penalty off) with the project's strict-box scorer (stapo_verl.rewards).
        reward.reward_manager.name=dapo
        reward.custom_reward_function.path=pkg://stapo_verl.rewards
        reward.custom_reward_function.name=compute_score
        # Trainer: the run trains TOTAL_STEPS steps (see TOTAL_EPOCHS above).
        "trainer.nnodes=$NNODES"
        "trainer.n_gpus_per_node=$GPUS_PER_NODE"
        "trainer.project_name=$PROJECT_NAME"
        "trainer.experiment_name=$EXP_NAME"
        "trainer.logger=$LOGGER"
        "trainer.total_training_steps=$TOTAL_STEPS"
        "trainer.total_epochs=$TOTAL_EPOCHS"
        "trainer.test_freq=$TEST_FREQ"
        "trainer.save_freq=$SAVE_FREQ"
        "trainer.val_before_train=$VAL_BEFORE_TRAIN"
        "trainer.default_local_dir='$CKPT_PATH'"
        trainer.resume_mode=auto
        trainer.critic_warmup=0
        "+trainer.reproducible=$REPRODUCIBLE"
    )
    if stapo_is_true "$STOP_AT_END_OF_TURN"; then
        # vLLM's --generation-config <folder> (verl passes engine_kwargs.vllm through to `vllm serve`);
        # the CPU rollout server reads the same key. The folder must be readable on every node.
        STAPO_OVERRIDES+=("+actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config='$GEN_CONFIG_DIR'")
    fi
    stapo_engine_overrides
    stapo_forward_env
}

# ---------------------------------------------------------------------------------------------------
# Engine deltas (ENGINE=megatron on every GPU size; the tiny CPU size defaults to fsdp).
stapo_engine_overrides() {
    local offload=False
    stapo_is_true "$OFFLOAD" && offload=True
    case $ENGINE in
    megatron)
        STAPO_OVERRIDES+=(
            # Megatron engine through verl's defaults list (ppo_megatron_trainer.yaml is deprecated).
            model_engine=megatron
            actor_rollout_ref.actor.optim.lr_decay_style=constant
            # Megatron parallelism and memory (docs/recipes.md §3).
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$ACTOR_TP"
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$ACTOR_PP"
            "actor_rollout_ref.actor.megatron.context_parallel_size=$ACTOR_CP"
            # HF weights loaded by Megatron-Bridge (use_mbridge, no manual conversion).
            actor_rollout_ref.actor.megatron.use_mbridge=True
            actor_rollout_ref.actor.megatron.vanilla_mbridge=False
            actor_rollout_ref.actor.megatron.use_distributed_optimizer=True
            actor_rollout_ref.actor.megatron.dtype=bfloat16
            "actor_rollout_ref.actor.megatron.param_offload=$offload"
            "actor_rollout_ref.actor.megatron.optimizer_offload=$offload"
            # Full recompute: without it the activations at a 32k-token budget alone exceed 80 GB.
            actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
            actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method=uniform
            actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers=1
        )
        if [[ -n $DIST_CKPT_PATH ]]; then
            # Pre-converted Megatron dist checkpoint (verl scripts/converter_hf_to_mcore.py); model.path
            # is still needed for the HF config and tokenizer.
            STAPO_OVERRIDES+=(
                actor_rollout_ref.actor.megatron.use_dist_checkpointing=True
                "actor_rollout_ref.actor.megatron.dist_checkpointing_path='$DIST_CKPT_PATH'"
            )
        fi
        ;;
    fsdp)
        STAPO_OVERRIDES+=(
            # verl's default engine (model_engine=dp), FSDP2.
            model_engine=dp
            actor_rollout_ref.actor.strategy=fsdp2
            actor_rollout_ref.actor.optim.lr_scheduler_type=constant
            "actor_rollout_ref.actor.fsdp_config.param_offload=$offload"
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$offload"
        )
        ;;
    esac
}

# ---------------------------------------------------------------------------------------------------
# Per-method deltas on top of the base (JustRL = base; STAPO = JustRL + S2T). Shared by every size, tiny
# included. The masking ablations and 20-Entropy are verl's vanilla loss with one of the plugin's policy
# token masks (STAPO_METHOD_MASK above); the mask acts on the policy-gradient term only.
stapo_method_overrides() {
    local method=$1
    local model_engine=dp
    [[ $ENGINE == megatron ]] && model_engine=megatron
    # The plugin's config-group option: the engine's actor defaults + StapoPolicyLossConfig with the
    # STAPO keys declared, so they are set without `+` (stapo_verl/config_store.py).
    local stapo_actor="actor@actor_rollout_ref.actor=stapo_${model_engine}_actor"
    local pl=actor_rollout_ref.actor.policy_loss
    case $method in
    stapo | stapo_high_entropy | stapo_random | stapo_full_mask)
        STAPO_OVERRIDES+=("$stapo_actor")
        if [[ $method == stapo ]]; then
            STAPO_OVERRIDES+=("$pl.loss_mode=stapo")
        else
            STAPO_OVERRIDES+=("$pl.loss_mode=vanilla" "$pl.token_mask=${STAPO_METHOD_MASK[$method]}")
        fi
        STAPO_OVERRIDES+=(
            "$pl.s2t_tau_p=$STAPO_TAU_P"
            "$pl.s2t_entropy_quantile=$STAPO_Q"
            "$pl.stats_source=$STAPO_STATS_SOURCE"
        )
        # The diagnostics (mask statistics, LM-head gradient norm, collapse warning, tracker tables) are an option of
        # their own (policy_loss.mask_statistics, default off in the config); the recipes ask for them.
        # STAPO_DIAGNOSTICS=0 runs the mask alone.
        if stapo_is_true "${STAPO_DIAGNOSTICS:-1}"; then
            STAPO_OVERRIDES+=("$pl.mask_statistics=True")
        fi
        ;;
    justrl)
        # verl's own vanilla loss with the base's clip-higher (JustRL, arXiv 2512.16649).
        STAPO_OVERRIDES+=(actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)
        ;;
    grpo)
        # "As in the original paper" (DeepSeekMath, arXiv 2402.03300): symmetric clip 0.2, per-sequence mean,
        # KL loss low_var_kl with beta = GRPO_KL_COEF; same data, lengths, batches and optimizer as JustRL.
        STAPO_OVERRIDES+=(
            actor_rollout_ref.actor.policy_loss.loss_mode=vanilla
            actor_rollout_ref.actor.clip_ratio_high=0.2
            actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean
            actor_rollout_ref.actor.use_kl_loss=True
            actor_rollout_ref.actor.kl_loss_type=low_var_kl
            "actor_rollout_ref.actor.kl_loss_coef=$GRPO_KL_COEF"
            actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=$LOGPROB_MAX_TOKEN_LEN"
        )
        if [[ -n $DIST_CKPT_PATH && $ENGINE == megatron ]]; then
            STAPO_OVERRIDES+=(
                actor_rollout_ref.ref.megatron.use_dist_checkpointing=True
                "actor_rollout_ref.ref.megatron.dist_checkpointing_path='$DIST_CKPT_PATH'"
            )
        fi
        ;;
    top_entropy)
        # 20-Entropy (Wang et al. 2025, arXiv 2506.01939): the policy gradient of the 20 % highest-entropy
        # tokens of each optimizer mini-batch only, ranked by the old policy's entropy (verl's old-log-prob
        # pass; no gradient-carrying entropy, so calculate_entropy stays False).
        STAPO_OVERRIDES+=(
            "$stapo_actor"
            "$pl.loss_mode=vanilla"
            "$pl.token_mask=${STAPO_METHOD_MASK[top_entropy]}"
            "$pl.top_entropy_ratio=$TOP_ENTROPY_RATIO"
            "$pl.stats_source=$STAPO_STATS_SOURCE"
        )
        if stapo_is_true "${STAPO_DIAGNOSTICS:-1}"; then
            STAPO_OVERRIDES+=("$pl.mask_statistics=True")
        fi
        ;;
    *) stapo_die "unknown method '$method' (allowed: ${STAPO_METHODS[*]})" ;;
    esac
}

# ---------------------------------------------------------------------------------------------------
# Precision. BF16 is the default (Megatron dtype bfloat16, vLLM bf16). PRECISION=fp8 follows verl
# docs/low_precision/fp8.md "FP8 End-to-End": TE FP8 GEMMs with block-wise scaling, FP8 optimizer
# recipe, FP8 vLLM rollout, and token-level TIS against the train/rollout mismatch. The LM head stays
# BF16 on both sides (Megatron-Core's output layer is not a TE module; verl's vLLM FP8 path quantises
# LinearBase layers only), so the entropy and log-probs the token mask reads never come from FP8 logits.
# FP8 is not always faster than BF16 (docs/recipes.md, "FP8"): benchmark it on your cluster first.
stapo_precision_overrides() {
    [[ $PRECISION == fp8 ]] || return 0
    # verl's FP8 path requires this in every worker, not only the driver (verl docs/low_precision/fp8.md).
    export NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1
    STAPO_OVERRIDES+=(
        "+actor_rollout_ref.actor.megatron.override_transformer_config.fp8=$FP8_FORMAT"
        "+actor_rollout_ref.actor.megatron.override_transformer_config.fp8_recipe=$FP8_RECIPE"
        "+actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe=$FP8_RECIPE"
        actor_rollout_ref.rollout.quantization=fp8
        algorithm.rollout_correction.rollout_is=token
        "algorithm.rollout_correction.rollout_is_threshold=$TIS_THRESHOLD"
        "+ray_kwargs.ray_init.runtime_env.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES='1'"
    )
}

# ---------------------------------------------------------------------------------------------------
# stapo_token_mask <method> [user overrides...]: the policy_loss.token_mask the run ends up with (empty for none):
# the method's (stapo: s2t), unless a user override sets actor_rollout_ref.actor.policy_loss.token_mask (with or
# without +/++; the last one wins, as in Hydra). The only key the recipe reads from the user's overrides.
stapo_token_mask() {
    local method=$1 mask arg
    shift
    if [[ $method == stapo ]]; then
        mask=s2t
    else
        mask=${STAPO_METHOD_MASK[$method]:-}
    fi
    for arg in "$@"; do
        case $arg in
        actor_rollout_ref.actor.policy_loss.token_mask=* | +actor_rollout_ref.actor.policy_loss.token_mask=* | \
            ++actor_rollout_ref.actor.policy_loss.token_mask=*)
            mask=${arg#*=}
            mask=${mask//[\"\']/}
            ;;
        esac
    done
    [[ $mask == null ]] && mask=
    echo "$mask"
}

# ---------------------------------------------------------------------------------------------------
# Build the full override list for <size> <method> into STAPO_OVERRIDES. The user's overrides, when given, are
# only read for the token mask (stapo_token_mask); the caller appends them last.
stapo_build_overrides() {
    local size=$1 method=$2 token_mask
    shift 2
    token_mask=$(stapo_token_mask "$method" "$@")
    stapo_in_list "$size" "${STAPO_SIZES[@]}" || stapo_die "unknown size '$size' (allowed: ${STAPO_SIZES[*]})"
    stapo_in_list "$method" "${STAPO_METHODS[@]}" ||
        stapo_die "unknown method '$method' (allowed: ${STAPO_METHODS[*]})"
    stapo_size_defaults "$size"
    stapo_env_defaults "$size" "$method"
    [[ -n ${MODEL_PATH:-} ]] || stapo_die "MODEL_PATH is empty (size '$size' sets no default)"
    STAPO_OVERRIDES=()
    stapo_base_overrides
    # Size-only overrides (the tiny block) after the base, before the method: methods still win.
    STAPO_OVERRIDES+=(${STAPO_SIZE_OVERRIDES[@]+"${STAPO_SIZE_OVERRIDES[@]}"})
    stapo_method_overrides "$method"
    stapo_precision_overrides
}

# ---------------------------------------------------------------------------------------------------
# Ray: never start a cluster here. main_ppo's ray.init() connects to RAY_ADDRESS when it is set and
# starts a private single-node instance otherwise, which is only right for NNODES=1.
stapo_check_ray() {
    if [[ -n ${RAY_ADDRESS:-} ]]; then
        echo "[stapo recipe] using the existing Ray cluster at RAY_ADDRESS=$RAY_ADDRESS" >&2
    elif ((NNODES > 1)); then
        stapo_die "NNODES=$NNODES needs a running Ray cluster: 'ray start --head' on one node, 'ray start \
--address=<head>:6379' on the others, then export RAY_ADDRESS=<head>:6379 (see docs/recipes.md §5 or \
recipes/slurm/qwen3_8b_stapo.sbatch)"
    fi
}

# ---------------------------------------------------------------------------------------------------
# Write the stop-token generation config that engine_kwargs.vllm.generation_config points at (training
# only; --dry-run shows what it would hold). The ids come from the model's own files.
stapo_write_generation_config() {
    stapo_is_true "$STOP_AT_END_OF_TURN" || return 0
    "$PY" -m stapo_verl.stop_tokens --model "$MODEL_PATH" --out "$GEN_CONFIG_DIR" >&2 ||
        stapo_die "could not write the stop-token generation config for MODEL_PATH='$MODEL_PATH' into '$GEN_CONFIG_DIR' (STOP_AT_END_OF_TURN=0 skips it)"
}
