"""Registry of policy token masks (per-token selections for the policy-gradient term of any policy loss), which the
series adds to ``verl/trainer/ppo/core_algos.py`` beside ``register_policy_loss`` (``upstream/build_series.py``)."""

from __future__ import annotations

from collections.abc import Callable

POLICY_TOKEN_MASK_REGISTRY: dict[str, tuple[Callable, tuple[str, ...]]] = {}


def register_policy_token_mask(name: str, required_fields: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Register ``fn(batch, config, dp_group) -> (keep, metrics)`` as ``actor.policy_loss.token_mask=<name>`` (again:
    replaced), run per optimizer mini-batch on every rank. ``batch``: the ``required_fields``, tensors padded to (bs, T)
    on the group's device; ``config``: the ``ActorConfig``; ``keep``: (bs, T) bool; ``metrics``: ``{name: float}``."""

    def decorator(fn: Callable) -> Callable:
        POLICY_TOKEN_MASK_REGISTRY[name] = (fn, tuple(required_fields))
        return fn

    return decorator


def get_policy_token_mask(name: str) -> tuple[Callable, tuple[str, ...]]:
    """``(fn, required_fields)`` of the mask registered as ``name``; ValueError listing the registered names if none."""
    if name not in POLICY_TOKEN_MASK_REGISTRY:
        raise ValueError(f"Unsupported policy token mask: {name}. Supported masks are: {[*POLICY_TOKEN_MASK_REGISTRY]}")
    return POLICY_TOKEN_MASK_REGISTRY[name]
