"""The allowed type and values of each policy-loss key of the masks (one definition each; the diagnostics' keys:
:mod:`stapo_verl.diagnostics.config`): the config checks them when it is built, and a library function taking one of
these values (τ_p, q, ρ) calls the same check, with the same message. Imports neither torch nor verl.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the config nodes of the actor and of its policy-loss keys
ACTOR, KEY = "actor_rollout_ref.actor", "actor_rollout_ref.actor.policy_loss"


class StapoConfigError(ValueError):
    """An invalid value; the message names the full config key and what is allowed. Attributes: ``key`` (the full
    key; None for a cross-key rule), ``value``, ``allowed`` (what its range allows; None when the message says it)."""

    def __init__(self, message: str, *, key: str | None = None, value: Any = None, allowed: str | None = None):
        super().__init__(message)
        self.key, self.value, self.allowed = key, value, allowed


@dataclass(frozen=True)
class Range:
    """The allowed values of one key: ``test(value) -> bool``, and ``allowed``, what the error message says."""

    test: Callable[[Any], bool]
    allowed: str


#: ``actor_rollout_ref.actor.policy_loss.<key>`` → its allowed values (the type is the config field's)
RANGES = types.MappingProxyType({
    "s2t_tau_p": Range(lambda v: 0.0 < v < 1.0, "0 < s2t_tau_p < 1"),
    "s2t_entropy_quantile": Range(lambda v: 0.0 < v <= 1.0, "0 < s2t_entropy_quantile <= 1"),
    "top_entropy_ratio": Range(lambda v: 0.0 < v <= 1.0, "0 < top_entropy_ratio <= 1"),
})


def check_range(key: str, value, table=RANGES):
    """``value`` if it is allowed for ``actor_rollout_ref.actor.policy_loss.<key>`` (``table``: :data:`RANGES`).

    Raises:
        StapoConfigError: naming the key, the value and what is allowed.
        KeyError: ``key`` has no range here.
    """
    rule = table[key]
    if not rule.test(value):
        raise StapoConfigError(f"{KEY}.{key}={value!r} is out of range: allowed {rule.allowed}",
                               key=f"{KEY}.{key}", value=value, allowed=rule.allowed)
    return value


#: the type each of the masks' policy-loss keys takes (a bool is never a number; NaN fails the range)
TYPES = types.MappingProxyType({
    "token_mask": ((str, type(None)), "a mask name or null"),
    "stats_source": ((str,), "a string"),
    "s2t_tau_p": ((int, float), "a number"),
    "s2t_entropy_quantile": ((int, float), "a number"),
    "top_entropy_ratio": ((int, float), "a number"),
    "random_mask_seed": ((int,), "an int"),
    "mask_statistics": ((bool,), "true or false (unquoted)"),
    "dump_tokens": ((bool,), "true or false (unquoted)"),
})


def check_type(key: str, value, table=TYPES):
    """``value`` if it has the type of ``actor_rollout_ref.actor.policy_loss.<key>`` (``table``: :data:`TYPES`).

    Raises:
        StapoConfigError: naming the key, the value, its type and what is allowed (a quoted number is a string).
        KeyError: ``key`` has no type here.
    """
    kinds, allowed = table[key]
    if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
        raise StapoConfigError(f"{KEY}.{key}={value!r} ({type(value).__name__}): allowed {allowed}",
                               key=f"{KEY}.{key}", value=value, allowed=allowed)
    return value
