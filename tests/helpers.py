"""Test helpers: build verl actor configs with a STAPO policy loss (no Hydra needed)."""

from __future__ import annotations

from verl.workers.config import ActorConfig, PolicyLossConfig

from stapo_verl.config import StapoPolicyLossConfig


def actor_config(loss_mode: str = "stapo", clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", **pl_kwargs):
    """verl ``ActorConfig`` as the worker builds it (``omega_conf_to_dataclass``), with our policy_loss."""
    if loss_mode == "vanilla":
        pl = PolicyLossConfig(loss_mode="vanilla")
    else:
        pl = StapoPolicyLossConfig(loss_mode=loss_mode, **pl_kwargs)
    return ActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
        loss_agg_mode=agg,
        policy_loss=pl,
        rollout_n=1,
    )
