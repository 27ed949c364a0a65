"""Cross-key validation of a STAPO run, executed inside verl's own ``validate_config``.

``main_ppo`` calls ``verl.utils.config.validate_config(config, ...)`` on the driver before any worker starts;
the plugin wraps that function (module attribute, no file edit) so a STAPO misconfiguration fails there with a
message naming the key. Per-key range checks live in :class:`stapo_verl.config.StapoPolicyLossConfig`.
"""

from __future__ import annotations

import functools
import logging

from stapo_verl import STAPO_LOSS_MODES
from stapo_verl.config import STATS_SOURCES, StapoConfigError, StapoPolicyLossConfig, check_registered

logger = logging.getLogger(__name__)

_TARGET = "stapo_verl.config.StapoPolicyLossConfig"
_ACTOR = "actor_rollout_ref.actor"


def _get(cfg, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        try:
            node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # omegaconf struct errors on missing keys
            return default
    return default if node is None else node


def _is_stapo_config_class(target: str) -> bool:
    """True if ``target`` imports as :class:`StapoPolicyLossConfig` or a subclass (a user's own config class)."""
    from hydra.utils import get_class

    try:
        cls = get_class(str(target))
    except Exception:  # not importable: the caller's error message names the value
        return False
    return isinstance(cls, type) and issubclass(cls, StapoPolicyLossConfig)


def needs_current_entropy(loss_mode: str, stats_source: str) -> bool:
    """True if the loss reads current-policy entropy (so ``actor.calculate_entropy`` must be True)."""
    return loss_mode == "top_entropy" or stats_source == "current_micro_batch"


def _n_minibatches(config) -> int | None:
    """Optimizer mini-batches per step (× ppo_epochs), or None when the keys are missing."""
    try:
        tbs = int(_get(config, "data.train_batch_size"))
        mbs = int(_get(config, f"{_ACTOR}.ppo_mini_batch_size"))
        epochs = int(_get(config, f"{_ACTOR}.ppo_epochs", 1))
    except (TypeError, ValueError):
        return None
    return max(tbs // max(mbs, 1), 1) * epochs


def validate_stapo_config(config) -> None:
    """Check the keys a STAPO loss mode depends on; no-op for other loss modes.

    Args:
        config: the full composed trainer config (OmegaConf DictConfig of ``ppo_trainer``).
    Raises:
        StapoConfigError: ``_target_`` missing, ``actor.calculate_entropy`` inconsistent with the statistics
            source, ``old_policy``/``current_minibatch`` without the v1 trainer's old-log-prob pass, or
            distillation enabled.
        stapo_verl.config.StapoNotRegisteredError: the loss is ours but not registered in this process.
    Source: verl_notes §5–6, bugs D15/D16/D19/D20; spec §10 A3.
    """
    pl = _get(config, f"{_ACTOR}.policy_loss")
    loss_mode = _get(pl, "loss_mode", "vanilla")
    if loss_mode not in STAPO_LOSS_MODES:
        return
    check_registered(loss_mode)
    target = _get(pl, "_target_", "")
    if target != _TARGET and not _is_stapo_config_class(target):
        raise StapoConfigError(
            f"{_ACTOR}.policy_loss.loss_mode={loss_mode} needs {_ACTOR}.policy_loss._target_={_TARGET} "
            f"(got {target!r}); without it the STAPO keys (tau_p, entropy_quantile, ...) are rejected by verl"
        )
    stats_source = _get(pl, "stats_source", "old_policy")
    if stats_source not in STATS_SOURCES:
        raise StapoConfigError(f"{_ACTOR}.policy_loss.stats_source={stats_source!r}: allowed {list(STATS_SOURCES)}")
    calc_entropy = bool(_get(config, f"{_ACTOR}.calculate_entropy", False))
    if needs_current_entropy(loss_mode, stats_source) and not calc_entropy:
        why = "top_entropy (20-Entropy)" if loss_mode == "top_entropy" else "stats_source=current_micro_batch"
        raise StapoConfigError(
            f"{why} reads the current-policy entropy: set {_ACTOR}.calculate_entropy=True (got False)"
        )
    if not needs_current_entropy(loss_mode, stats_source):
        # old_policy and current_minibatch both read the v1 trainer's old-log-prob pass (current_minibatch for
        # the first mini-batch of a step, where π_θ = π_old, and for its mask_disagreement diagnostic).
        if not bool(_get(config, "trainer.use_v1", True)):
            raise StapoConfigError(
                f"stats_source={stats_source} uses the old-policy log-prob/entropy of verl's v1 trainer: set "
                "trainer.use_v1=True or use ++actor_rollout_ref.actor.policy_loss.stats_source=current_micro_batch"
            )
        if bool(_get(config, "algorithm.rollout_correction.bypass_mode", False)):
            raise StapoConfigError(
                f"stats_source={stats_source} needs verl's old-log-prob pass, which "
                "algorithm.rollout_correction.bypass_mode=True skips: set it to False or use "
                "stats_source=current_micro_batch"
            )
        if calc_entropy:
            logger.warning(
                "%s.calculate_entropy=True is not needed by stats_source=%s: it makes verl compute a "
                "gradient-carrying entropy in every training forward (memory, D20). Set it to False.",
                _ACTOR,
                stats_source,
            )
        if stats_source == "current_minibatch":
            pp = int(_get(config, f"{_ACTOR}.megatron.pipeline_model_parallel_size", 1) or 1)
            if _get(config, f"{_ACTOR}.strategy", "") == "megatron" and pp > 1:
                raise StapoConfigError(
                    f"stats_source=current_minibatch is not supported with {_ACTOR}.megatron."
                    f"pipeline_model_parallel_size={pp} (only the last pipeline stage holds the extra forward's "
                    "outputs): use stats_source=old_policy or pipeline_model_parallel_size=1"
                )
            n_mini = _n_minibatches(config)
            if n_mini == 1:
                logger.warning(
                    "stats_source=current_minibatch with one optimizer mini-batch per step (actor.ppo_mini_batch_size "
                    "== data.train_batch_size, ppo_epochs=1) is identical to old_policy and costs nothing extra; "
                    "it only differs with several mini-batches per step."
                )
    if _get(config, "distillation.enabled", False):
        raise StapoConfigError(f"loss_mode={loss_mode} is not supported together with distillation.enabled=True")
    if float(_get(config, f"{_ACTOR}.entropy_coeff", 0.0) or 0.0) != 0.0:
        logger.warning("STAPO is defined without an entropy bonus; %s.entropy_coeff is non-zero (D19).", _ACTOR)


def install_validate_config_hook() -> None:
    """Wrap ``verl.utils.config.validate_config`` so it also runs :func:`validate_stapo_config` first."""
    import verl.utils.config as vcfg

    orig = vcfg.validate_config
    if getattr(orig, "__stapo_wrapped__", False):
        return

    @functools.wraps(orig)
    def validate_config(config, *args, **kwargs):
        validate_stapo_config(config)
        return orig(config, *args, **kwargs)

    validate_config.__stapo_wrapped__ = True
    vcfg.validate_config = validate_config
