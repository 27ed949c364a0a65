"""The cross-key checks of a composed trainer config that asks for a token mask, on the driver before Ray (the
``validate_config`` wrapper, :mod:`..driver_config`). What the series does instead: a batch without the fields the mask
declares raises a ``KeyError`` naming them."""

from __future__ import annotations

import logging

from stapo_verl.algo.config_ranges import ACTOR, KEY, StapoConfigError, check_current_minibatch_pipeline
from stapo_verl.integration.verl_0_9_1.job import asks_for_mask
from stapo_verl.integration.verl_0_9_1.policy_loss.config import (
    StapoPolicyLossConfig,
    check_renamed_keys,
    require_plugin_loaded,
    stapo_target,
)

logger = logging.getLogger(__name__)


def _get(config, dotted: str, default=None):
    value = config
    for part in dotted.split("."):
        value = value.get(part, None) if hasattr(value, "get") else None
    return default if value is None else value


def validate_token_mask_config(config) -> None:
    """Cross-key checks of a trainer config (OmegaConf ``DictConfig``) with a token mask, after
    :func:`..policy_loss.config.fill_policy_loss_target`; nothing for a config without one.

    Raises:
        StapoConfigError: a renamed key has a value; ``_target_`` is not the plugin's class; the mask's statistics
            need verl's v1 old-log-prob pass (``trainer.use_v1=True``, ``rollout_correction.bypass_mode=False``);
            ``stats_source=current_minibatch`` with Megatron pipeline parallelism; distillation is enabled.
        StapoNotRegisteredError: the plugin is not loaded in this process.
    """
    from hydra.utils import get_class

    pl = _get(config, KEY)
    if pl is None or not asks_for_mask(pl):
        return
    require_plugin_loaded()
    check_renamed_keys(pl)
    target = _get(pl, "_target_", "")
    try:
        ours = issubclass(get_class(str(target)), StapoPolicyLossConfig)
    except Exception:  # not importable, or not a class
        ours = False
    if not ours:
        raise StapoConfigError(f"{KEY}: loss_mode={_get(pl, 'loss_mode')}, token_mask={_get(pl, 'token_mask')} need "
                               f"{KEY}._target_={stapo_target()} (got {target!r})")
    if not bool(_get(config, "trainer.use_v1", True)):
        raise StapoConfigError("the token mask reads the old-log-prob pass (old_log_probs, entropy) of verl's v1 "
                               "trainer: set trainer.use_v1=True")
    if bool(_get(config, "algorithm.rollout_correction.bypass_mode", False)):
        raise StapoConfigError("the token mask needs verl's old-log-prob pass (old_log_probs and entropy), which "
                               "algorithm.rollout_correction.bypass_mode=True skips: set it to False")
    if _get(pl, "stats_source") == "current_minibatch" and _get(config, f"{ACTOR}.strategy", "") == "megatron":
        check_current_minibatch_pipeline(int(_get(config, f"{ACTOR}.megatron.pipeline_model_parallel_size", 1)))
    if _get(config, "distillation.enabled", False):
        raise StapoConfigError(f"{KEY}.token_mask is not supported with distillation.enabled=True: verl's "
                               "distillation loss builds its policy-gradient term without the mask")
    if bool(_get(config, f"{ACTOR}.calculate_entropy", False)):
        logger.warning("%s.calculate_entropy=True is not needed by the token mask (it reads the old-log-prob pass's "
                       "entropy); it makes verl compute a gradient-carrying entropy in every training forward. Set it "
                       "to False.", ACTOR)
    if float(_get(config, f"{ACTOR}.entropy_coeff", 0.0) or 0.0) != 0.0:
        logger.warning("STAPO is defined without an entropy bonus; %s.entropy_coeff is non-zero.", ACTOR)
