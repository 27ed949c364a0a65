#!/usr/bin/env bash
# Tiny end-to-end STAPO run on CPU (≈ minutes on 2 cores). Extra arguments are Hydra overrides.
# Outputs: outputs/tiny_cpu_stapo/{train.log,metrics.jsonl,plot.png,summary.json,summary.md,ckpt/}
set -euo pipefail
RUN_NAME="${RUN_NAME:-tiny_cpu_stapo}"
LOSS_ARGS=(
  actor_rollout_ref.actor.policy_loss._target_=stapo_verl.config.StapoPolicyLossConfig
  actor_rollout_ref.actor.policy_loss.loss_mode=stapo
  # tau_p is raised for the 384-token tiny model (paper: 0.002 with a 151k vocabulary). Its policy is very
  # peaked (entropy ~0.06 nat/token): p < 0.002 hits ~0.03% of sampled tokens and almost never a positive-
  # advantage one, so STAPO would mask nothing and equal GRPO. Paper value: pass
  # actor_rollout_ref.actor.policy_loss.tau_p=0.002 (no "+": the key exists once this line has run).
  +actor_rollout_ref.actor.policy_loss.tau_p=0.1
  +actor_rollout_ref.actor.policy_loss.entropy_quantile=0.75
  +actor_rollout_ref.actor.policy_loss.stats_source=old_policy
)
source "$(dirname "${BASH_SOURCE[0]}")/common/tiny_cpu_base.sh"
