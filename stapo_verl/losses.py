"""Placeholder: registers the loss names, delegating to vanilla (being written)."""
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from stapo_verl import STAPO_LOSS_MODES

for _m in STAPO_LOSS_MODES:
    register_policy_loss(_m)(compute_policy_loss_vanilla)
