#!/usr/bin/env bash
# Tiny end-to-end GRPO baseline on CPU (the GPU sizes' grpo delta: symmetric clip, seq-mean-token-mean,
# low_var_kl KL loss against the reference model); same base and CPU delta as tiny_cpu_stapo.sh.
#   recipes/tiny_cpu_grpo.sh [--dry-run | --print-overrides] [hydra overrides...]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" tiny grpo "$@"
