"""Hydra options ``actor/stapo_dp_actor`` and ``actor/stapo_megatron_actor`` (the mask keys without ``+``), selected
like any verl actor config: ``'actor@actor_rollout_ref.actor=stapo_${model_engine}_actor'``. Each is verl's
``<engine>_actor`` plus ``policy_loss._target_``, ``loss_mode: stapo``, ``token_mask: s2t`` and every other field of
:class:`~.config.StapoPolicyLossConfig` with its default; stored in Hydra's ``ConfigStore`` at plugin import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import MISSING
from verl.workers.config.actor import PolicyLossConfig

from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig, stapo_target

#: verl model engines (``model_engine=…``) the options exist for
ENGINES = ("dp", "megatron")


def option_name(engine: str) -> str:
    """``stapo_<engine>_actor`` for verl's ``<engine>_actor``; ValueError when ``engine`` is not in :data:`ENGINES`."""
    if engine not in ENGINES:
        raise ValueError(f"model_engine={engine!r}: STAPO actor options exist for {list(ENGINES)}")
    return f"stapo_{engine}_actor"


def stapo_policy_loss_keys() -> dict[str, Any]:
    """The fields :class:`StapoPolicyLossConfig` adds to verl's ``PolicyLossConfig``, mapped to their defaults (from
    ``dataclasses.fields``, so a field added later is declared too; without a default: OmegaConf's ``???``)."""
    inherited, nothing = {f.name for f in dataclasses.fields(PolicyLossConfig)}, dataclasses.MISSING
    return {f.name: f.default if f.default is not nothing else f.default_factory() if f.default_factory is not nothing
            else MISSING for f in dataclasses.fields(StapoPolicyLossConfig) if f.name not in inherited}


def actor_option_node(engine: str) -> dict[str, Any]:
    """The config node stored as ``actor/stapo_<engine>_actor`` (a plain dict; Hydra reads its ``defaults``)."""
    option_name(engine)  # validates engine
    return {
        "defaults": [f"{engine}_actor", "_self_"],
        "policy_loss": {"_target_": stapo_target(), **stapo_policy_loss_keys(), "loss_mode": "stapo",
                        "token_mask": "s2t"},
    }


def register() -> None:
    """Store ``actor/stapo_<engine>_actor`` for every engine in :data:`ENGINES` in Hydra's ConfigStore (again:
    replaced)."""
    from hydra.core.config_store import ConfigStore

    for engine in ENGINES:
        ConfigStore.instance().store(group="actor", name=option_name(engine), node=actor_option_node(engine),
                                     provider="stapo_verl")
