"""STAPO hyperparameters under ``actor_rollout_ref.actor.policy_loss`` (a ``_target_`` subclass of verl's config).

Usage (verl Hydra override syntax; ``+`` because verl's ``actor.yaml`` does not declare these keys)::

    actor_rollout_ref.actor.policy_loss._target_=stapo_verl.config.StapoPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=stapo
    +actor_rollout_ref.actor.policy_loss.tau_p=0.002
    +actor_rollout_ref.actor.policy_loss.entropy_quantile=0.75

Source: spec §0/§2 (defaults), verl ``verl/workers/config/actor.py`` (``PolicyLossConfig``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verl.workers.config.actor import PolicyLossConfig

from stapo_verl import STAPO_LOSS_MODES

STATS_SOURCES = ("old_policy", "current_micro_batch")
TOP_ENTROPY_NORMALIZERS = ("kept", "all_tokens")


class StapoConfigError(ValueError):
    """Raised for an invalid STAPO config value; the message names the key and the allowed range."""


class StapoNotRegisteredError(RuntimeError):
    """Raised when ``loss_mode`` names a stapo-verl loss that is not registered in this process."""


def _not_registered_message(loss_mode: str) -> str:
    return (
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is a stapo-verl loss, but it is not "
        f"registered in this process (pid {os.getpid()}). verl loads plugins through the 'verl.plugins' entry "
        "point and silently ignores import errors. Fix: `pip install -e <stapo-verl checkout>` (or the wheel) "
        "in the Python environment of EVERY node; do not set VERL_USE_EXTERNAL_PLUGINS=none (or include "
        "'stapo' in its list); check `python -c 'import stapo_verl.plugin'` for an import error; as a "
        "fallback pass +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=stapo_verl.plugin."
    )


def check_registered(loss_mode: str) -> None:
    """Raise :class:`StapoNotRegisteredError` if ``loss_mode`` is ours but absent from verl's registry.

    Args:
        loss_mode: the ``policy_loss.loss_mode`` string.
    Raises:
        StapoNotRegisteredError: ``loss_mode`` in :data:`stapo_verl.STAPO_LOSS_MODES` and not in
            ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``.
    """
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if loss_mode in STAPO_LOSS_MODES and loss_mode not in POLICY_LOSS_REGISTRY:
        raise StapoNotRegisteredError(_not_registered_message(loss_mode))


@dataclass
class StapoPolicyLossConfig(PolicyLossConfig):
    """verl ``PolicyLossConfig`` plus the STAPO / 20-Entropy hyperparameters.

    Instantiated by Hydra (``_target_``) on the driver (``validate_config``) and in every actor worker
    (``init_model``), so ``__post_init__`` doubles as the per-process self-check.

    Attributes:
        tau_p: τ_p, absolute probability threshold; a token is a candidate iff p < tau_p (strict).
            Allowed 0 < tau_p < 1. Default 0.002 (spec §0).
        entropy_quantile: q; τ_h = torch.quantile(P, q, 'linear') over the candidate population P.
            Allowed 0 < q <= 1. Default 0.75 (spec §2.3).
        stats_source: where p and H come from. ``old_policy`` (default): the old-policy log-prob and
            entropy verl's v1 trainer already computes, reduced over the whole optimizer mini-batch
            across DP before its first forward (exact renormalisation, zero extra forwards).
            ``current_micro_batch``: current-policy values from the training forward, per micro-batch,
            candidates gathered across DP (needs ``actor.calculate_entropy=True``).
        top_entropy_ratio: ρ for ``loss_mode=top_entropy`` (20-Entropy): keep the top ⌈ρ·N⌉ tokens by
            entropy. Allowed 0 < ρ <= 1. Default 0.2.
        top_entropy_normalizer: ``kept`` (official 80/20 code: token-mean over kept tokens) or
            ``all_tokens`` (the paper's formula: sum over kept tokens / all valid tokens).
        random_mask_seed: seed of ``loss_mode=stapo_random`` (mixed with the step's mini-batch content).
    Raises:
        StapoConfigError: a value out of range (message names the key and the allowed range).
        StapoNotRegisteredError: ``loss_mode`` is ours but the plugin did not load in this process.
    """

    tau_p: float = 0.002
    entropy_quantile: float = 0.75
    stats_source: str = "old_policy"
    top_entropy_ratio: float = 0.2
    top_entropy_normalizer: str = "kept"
    random_mask_seed: int = 0

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        key = "actor_rollout_ref.actor.policy_loss"
        tau_p = float(self.tau_p)
        if not (0.0 < tau_p < 1.0):
            raise StapoConfigError(f"{key}.tau_p={self.tau_p!r} is out of range: allowed 0 < tau_p < 1")
        q = float(self.entropy_quantile)
        if not (0.0 < q <= 1.0):
            raise StapoConfigError(
                f"{key}.entropy_quantile={self.entropy_quantile!r} is out of range: allowed 0 < q <= 1"
            )
        if self.stats_source not in STATS_SOURCES:
            raise StapoConfigError(f"{key}.stats_source={self.stats_source!r}: allowed {list(STATS_SOURCES)}")
        rho = float(self.top_entropy_ratio)
        if not (0.0 < rho <= 1.0):
            raise StapoConfigError(
                f"{key}.top_entropy_ratio={self.top_entropy_ratio!r} is out of range: allowed 0 < ratio <= 1"
            )
        if self.top_entropy_normalizer not in TOP_ENTROPY_NORMALIZERS:
            raise StapoConfigError(
                f"{key}.top_entropy_normalizer={self.top_entropy_normalizer!r}: allowed {list(TOP_ENTROPY_NORMALIZERS)}"
            )
        if not isinstance(self.random_mask_seed, int) or isinstance(self.random_mask_seed, bool):
            raise StapoConfigError(f"{key}.random_mask_seed={self.random_mask_seed!r}: allowed an int")
        if self.loss_mode not in STAPO_LOSS_MODES:
            raise StapoConfigError(
                f"{key}.loss_mode={self.loss_mode!r} with _target_=stapo_verl.config.StapoPolicyLossConfig: "
                f"allowed {list(STAPO_LOSS_MODES)} (use verl's PolicyLossConfig for other modes)"
            )
        check_registered(self.loss_mode)
