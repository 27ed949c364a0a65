"""Hydra config-group options ``actor/stapo_dp_actor`` and ``actor/stapo_megatron_actor``: the mask keys without ``+``.

Selected like any verl actor config (``ppo_trainer.yaml``'s ``- actor@actor_rollout_ref.actor: ${model_engine}_actor``)::

    python -m verl.trainer.main_ppo ... 'actor@actor_rollout_ref.actor=stapo_${model_engine}_actor' \\
        actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.01

Each is ``defaults: [<engine>_actor, _self_]`` plus ``policy_loss._target_``, ``loss_mode: stapo``, ``token_mask: s2t``
and every other field :class:`~.config.StapoPolicyLossConfig` adds, with its default (a misspelt key fails in Hydra).
Stored in Hydra's ``ConfigStore`` at plugin import, before ``@hydra.main`` composes (Hydra 1.3 "Config Store API").
"""

from __future__ import annotations

import dataclasses
from typing import Any

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
    """The fields :class:`StapoPolicyLossConfig` adds to verl's ``PolicyLossConfig`` (all with a plain default), mapped
    to their defaults (from ``dataclasses.fields``, so a field added later is declared too)."""
    inherited = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    return {f.name: f.default for f in dataclasses.fields(StapoPolicyLossConfig) if f.name not in inherited}


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
