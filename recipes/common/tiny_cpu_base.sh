#!/usr/bin/env bash
# Shared body of the tiny CPU runs (recipes/tiny_cpu_stapo.sh, recipes/tiny_cpu_grpo.sh).
# Caller sets: RUN_NAME, LOSS_ARGS (array of Hydra overrides for actor_rollout_ref.actor.policy_loss.*).
# Env knobs: STAPO_ASSETS (asset dir, default ~/.cache/stapo_verl/tiny), STAPO_RUN_DIR (default
# outputs/$RUN_NAME), STAPO_VENV (venv, default .venv). Every argument is passed to verl as a Hydra override
# (later overrides win), e.g. `bash recipes/tiny_cpu_stapo.sh trainer.total_training_steps=2`.
# `--dry-run` as the first argument prints the command instead of running it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then DRY_RUN=1; shift; fi

VENV="${STAPO_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  VENV="$(bash "$ROOT/scripts/setup_env.sh" | tail -n 1)"
fi
PY="$VENV/bin/python"

export VERL_PLATFORM=cpu RAY_AUTH_MODE=disabled WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
export RAY_DISABLE_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export PYTHONHASHSEED=0

ASSETS="${STAPO_ASSETS:-$HOME/.cache/stapo_verl/tiny}"
"$PY" -m stapo_verl.cpu.make_assets --out "$ASSETS" >/dev/null
read_manifest() { "$PY" -c "import json,sys; m=json.load(open('$ASSETS/assets.json')); print(m[sys.argv[1]])" "$1"; }
MODEL="$(read_manifest model_dir)"
TRAIN="$(read_manifest train_file)"
VAL_LIST="$("$PY" -c "import json; m=json.load(open('$ASSETS/assets.json')); print(','.join(\"'\"+f+\"'\" for f in [m['val_file']]+m['benchmark_val_files']))")"

RUN_DIR="${STAPO_RUN_DIR:-$ROOT/outputs/$RUN_NAME}"
mkdir -p "$RUN_DIR"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
export VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics.jsonl"

ARGS=(
  # ---- CPU backend (stapo_verl/cpu): platform, virtual GPU for verl's pools, rollout server
  trainer.device=cpu trainer.nnodes=1 trainer.n_gpus_per_node=1
  +ray_kwargs.ray_init.num_gpus=1 ray_kwargs.ray_init.num_cpus=8
  +ray_kwargs.ray_init.include_dashboard=False
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu
  +ray_kwargs.ray_init.runtime_env.env_vars.RAY_AUTH_MODE=disabled
  +ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE=disabled
  +ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH="$RUN_DIR/metrics.jsonl"
  '+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="1"'
  '+ray_kwargs.ray_init.runtime_env.env_vars.STAPO_CPU_ROLLOUT_THREADS="1"'
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1
  actor_rollout_ref.rollout.name=cpu actor_rollout_ref.rollout.mode=async
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.agent.num_workers=1 reward.num_workers=1
  # ---- model / engine (FSDP2 on gloo, fp32, SDPA, no compile, no ref model)
  actor_rollout_ref.model.path="$MODEL"
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  actor_rollout_ref.model.enable_gradient_checkpointing=False
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.use_torch_compile=False
  actor_rollout_ref.actor.fsdp_config.use_torch_compile=False
  actor_rollout_ref.actor.fsdp_config.model_dtype=fp32
  "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
  actor_rollout_ref.actor.use_kl_loss=False algorithm.use_kl_in_reward=False
  actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.actor.optim.lr=4e-4 actor_rollout_ref.actor.optim.lr_warmup_steps=0
  actor_rollout_ref.actor.grad_clip=1.0
  # ---- data: synthetic arithmetic (train) + synthetic/GSM8K/MATH500 slices (val)
  data.train_files="$TRAIN" data.val_files="[$VAL_LIST]"
  data.train_batch_size=16 data.max_prompt_length=128 data.max_response_length=40
  data.filter_overlong_prompts=False data.truncation=left data.seed=1
  # ---- GRPO: n=8 samples per prompt, one optimizer step per RL step
  algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=8
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
  actor_rollout_ref.rollout.calculate_log_probs=True
  # validation is sampled at the training temperature (the accuracy the RL objective moves)
  actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.temperature=1.0
  actor_rollout_ref.rollout.val_kwargs.n=4
  # ---- reward: the project's rule-based scorer (math_dapo → strict \boxed{} ±1)
  reward.custom_reward_function.path=pkg://stapo_verl.rewards
  reward.custom_reward_function.name=compute_score
  # ---- trainer: short run, console + JSONL metrics, one checkpoint at the end
  trainer.project_name=stapo_tiny_cpu trainer.experiment_name="$RUN_NAME"
  trainer.logger=[console,file]
  trainer.total_training_steps=20 trainer.total_epochs=100
  trainer.val_before_train=True trainer.test_freq=10
  trainer.save_freq=10 trainer.resume_mode=auto trainer.max_actor_ckpt_to_keep=2
  trainer.default_local_dir="$RUN_DIR/ckpt"
  "${LOSS_ARGS[@]}"
)

CMD=("$PY" -m verl.trainer.main_ppo "${ARGS[@]}" "$@")
if [ "$DRY_RUN" = 1 ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
# verl's file logger truncates its file: keep earlier invocations' metrics (e.g. before a resume).
if [ -s "$RUN_DIR/metrics.jsonl" ]; then mv "$RUN_DIR/metrics.jsonl" "$RUN_DIR/metrics.$(date +%s).jsonl"; fi

START=$(date +%s)
set +e
"${CMD[@]}" 2>&1 | tee "$RUN_DIR/train.log"
RC=${PIPESTATUS[0]}
set -e
END=$(date +%s)
echo "{\"wall_seconds\": $((END - START)), \"returncode\": $RC}" > "$RUN_DIR/wall.json"
"$PY" -m stapo_verl.cpu.plot --run "$RUN_DIR" --wall-seconds $((END - START)) || echo "plot failed" >&2
exit $RC
