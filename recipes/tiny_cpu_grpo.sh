#!/usr/bin/env bash
# Tiny end-to-end GRPO baseline on CPU (plain loss_mode=vanilla); same settings as tiny_cpu_stapo.sh.
set -euo pipefail
RUN_NAME="${RUN_NAME:-tiny_cpu_grpo}"
LOSS_ARGS=(actor_rollout_ref.actor.policy_loss.loss_mode=vanilla)
source "$(dirname "${BASH_SOURCE[0]}")/common/tiny_cpu_base.sh"
