"""The driver's work on a composed trainer config that asks for a token mask, before Ray (:mod:`..driver_config`'s
wrappers): the ``_target_`` fill (:func:`fill_policy_loss_target`; the series has the keys in verl's own config) and
the cross-key checks (:func:`validate_token_mask_config`)."""

from __future__ import annotations

import logging
from types import MappingProxyType

from omegaconf import DictConfig, open_dict, read_write
from verl.workers.config.actor import PolicyLossConfig

from stapo_verl.algo.config_ranges import ACTOR, KEY, StapoConfigError
from stapo_verl.integration.verl_0_9_1.job import asks_for_mask, config_value
from stapo_verl.integration.verl_0_9_1.policy_loss.config import (
    StapoPolicyLossConfig,
    require_plugin_loaded,
    stapo_target,
)

logger = logging.getLogger(__name__)
#: keys of earlier stapo-verl versions → their names now (one error line on the driver: :func:`check_renamed_keys`)
RENAMED_KEYS = MappingProxyType({"tau_p": "s2t_tau_p", "entropy_quantile": "s2t_entropy_quantile"})
VERL_DEFAULT_TARGET = "verl.workers.config.PolicyLossConfig"


def validate_token_mask_config(config) -> None:
    """:func:`fill_policy_loss_target`, then the cross-key checks of a trainer config (OmegaConf ``DictConfig``) with a
    token mask; nothing for a config without one.

    Raises:
        StapoConfigError: as :func:`fill_policy_loss_target`; the mask's statistics need verl's v1 old-log-prob pass
            (``trainer.use_v1=True``, ``rollout_correction.bypass_mode=False``); ``stats_source=current_minibatch``
            with Megatron pipeline parallelism; distillation is enabled.
        StapoNotRegisteredError: the plugin is not loaded in this process.
    """
    pl = config_value(config, KEY)
    if pl is None or not asks_for_mask(pl):
        return
    require_plugin_loaded()
    fill_policy_loss_target(config)
    if not bool(config_value(config, "trainer.use_v1", True)):
        raise StapoConfigError("the token mask reads the old-log-prob pass (old_log_probs, entropy) of verl's v1 "
                               "trainer: set trainer.use_v1=True")
    if bool(config_value(config, "algorithm.rollout_correction.bypass_mode", False)):
        raise StapoConfigError("the token mask needs verl's old-log-prob pass (old_log_probs and entropy), which "
                               "algorithm.rollout_correction.bypass_mode=True skips: set it to False")
    megatron = config_value(config, f"{ACTOR}.strategy", "") == "megatron"
    if megatron and config_value(pl, "stats_source") == "current_minibatch":
        from stapo_verl.minibatch.current_policy import check_current_minibatch_pipeline

        check_current_minibatch_pipeline(int(config_value(config, f"{ACTOR}.megatron.pipeline_model_parallel_size", 1)))
    if config_value(config, "distillation.enabled", False):
        raise StapoConfigError(f"{KEY}.token_mask is not supported with distillation.enabled=True: verl's "
                               "distillation loss builds its policy-gradient term without the mask")
    if bool(config_value(config, f"{ACTOR}.calculate_entropy", False)):
        logger.warning("%s.calculate_entropy=True is not needed by the token mask (it reads the old-log-prob pass's "
                       "entropy); it makes verl compute a gradient-carrying entropy in every training forward. Set it "
                       "to False.", ACTOR)
    if float(config_value(config, f"{ACTOR}.entropy_coeff", 0.0) or 0.0) != 0.0:
        logger.warning("STAPO is defined without an entropy bonus; %s.entropy_coeff is non-zero.", ACTOR)


def check_renamed_keys(values) -> None:
    """Raise StapoConfigError on a key of :data:`RENAMED_KEYS` with a value in a policy-loss node (a mapping), naming
    the new key (``tau_p`` → ``s2t_tau_p``) and the fix."""
    for old, new in RENAMED_KEYS.items():
        if values.get(old, None) is not None:
            raise StapoConfigError(f"{KEY}.{old}={values.get(old)!r}: the key was renamed to {KEY}.{new}. Fix: "
                                   f"{KEY}.{new}={values.get(old)}", key=f"{KEY}.{old}", value=values.get(old),
                                   allowed=f"null; set {KEY}.{new} instead")


def fill_policy_loss_target(config) -> bool:
    """Point ``policy_loss._target_`` (verl's ``actor.yaml``: its ``PolicyLossConfig``, which has no ``token_mask``)
    at :class:`StapoPolicyLossConfig` when the job asks for a mask, in place, so that every later
    ``omega_conf_to_dataclass`` (driver and workers) builds it. Returns whether it wrote ``_target_``.

    Raises:
        StapoConfigError: a renamed key has a value, or ``_target_`` names a class other than verl's or ours.
    """
    from hydra.utils import get_class

    pl = config.get("actor_rollout_ref", {}).get("actor", {}).get("policy_loss", None)
    if not isinstance(pl, DictConfig) or not asks_for_mask(pl):
        return False
    check_renamed_keys(pl)
    target = pl.get("_target_", None)
    try:
        cls = get_class(str(target)) if target not in (None, VERL_DEFAULT_TARGET) else PolicyLossConfig
    except Exception as e:  # ImportError, AttributeError, Hydra's ValueError: not a usable class
        raise StapoConfigError(f"{KEY}._target_={target!r} cannot be imported: {type(e).__name__}: {e}") from e
    if isinstance(cls, type) and issubclass(cls, StapoPolicyLossConfig):
        return False
    if cls is not PolicyLossConfig:
        raise StapoConfigError(f"{KEY}.loss_mode={pl.get('loss_mode')}/token_mask={pl.get('token_mask', None)} needs "
                               f"{KEY}._target_={stapo_target()} (or a subclass), got {target!r}. Remove the "
                               "_target_ override (the plugin sets it) or point it at that class.")
    with read_write(pl), open_dict(pl):
        pl["_target_"] = stapo_target()
    return True
