"""Hydra config-group options ``actor/stapo_dp_actor`` and ``actor/stapo_megatron_actor``: the mask keys without ``+``.

Selected like any verl actor config (``ppo_trainer.yaml``'s ``- actor@actor_rollout_ref.actor: ${model_engine}_actor``)::

    python -m verl.trainer.main_ppo ... 'actor@actor_rollout_ref.actor=stapo_${model_engine}_actor' \\
        actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.01

Each is ``defaults: [<engine>_actor, _self_]`` plus ``policy_loss._target_``, ``loss_mode: stapo``, ``token_mask: s2t``
and every other field :class:`~.config.StapoPolicyLossConfig` adds, with its default: declared keys need no ``+``, and
a misspelt one fails in Hydra. Stored in Hydra's ``ConfigStore`` at plugin import (inside ``import verl``, before
``@hydra.main`` composes). Source: Hydra 1.3 "Config Store API"; verl 0.9.1 ``trainer/config/actor/*.yaml``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import MISSING
from verl.workers.config.actor import PolicyLossConfig

from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig, stapo_target

#: verl model engines (``model_engine=…``) the options exist for; the plugin's entropy plumbing covers these.
ENGINES = ("dp", "megatron")
#: Config group the options live in (verl's ``trainer/config/actor/``).
GROUP = "actor"


def option_name(engine: str) -> str:
    """``stapo_<engine>_actor``: the option name for verl's ``<engine>_actor`` (``engine`` in :data:`ENGINES`).

    Raises:
        ValueError: ``engine`` is not in :data:`ENGINES`.
    """
    if engine not in ENGINES:
        raise ValueError(f"model_engine={engine!r}: STAPO actor options exist for {list(ENGINES)}")
    return f"stapo_{engine}_actor"


def stapo_policy_loss_keys() -> dict[str, Any]:
    """The fields :class:`StapoPolicyLossConfig` adds to verl's ``PolicyLossConfig``, mapped to their defaults.

    Derived from ``dataclasses.fields`` so a field added to the config later is declared automatically.
    A field without a default maps to OmegaConf's ``MISSING`` (``???``: the user must set it).
    """
    inherited = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    keys: dict[str, Any] = {}
    for f in dataclasses.fields(StapoPolicyLossConfig):
        if f.name in inherited:
            continue
        if f.default is not dataclasses.MISSING:
            keys[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            keys[f.name] = f.default_factory()
        else:
            keys[f.name] = MISSING
    return keys


def actor_option_node(engine: str) -> dict[str, Any]:
    """The config node stored as ``actor/stapo_<engine>_actor`` (a plain dict; Hydra reads its ``defaults``)."""
    option_name(engine)  # validates engine
    return {
        "defaults": [f"{engine}_actor", "_self_"],
        "policy_loss": {"_target_": stapo_target(), **stapo_policy_loss_keys(), "loss_mode": "stapo",
                        "token_mask": "s2t"},
    }


def register() -> None:
    """Store ``actor/stapo_<engine>_actor`` for every engine in :data:`ENGINES` in Hydra's ConfigStore.

    Idempotent (storing the same name again replaces the node).
    """
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for engine in ENGINES:
        cs.store(group=GROUP, name=option_name(engine), node=actor_option_node(engine), provider="stapo_verl")
