"""Registry of policy token masks (per-token selections for the policy-gradient term of any policy loss): the
extension point the series adds to ``verl/trainer/ppo/core_algos.py`` beside ``register_policy_loss`` (copied there by
``upstream/build_series.py``). Selected with ``actor_rollout_ref.actor.policy_loss.token_mask=<name>`` (``null``:
nothing changes); registering a name again replaces it.
"""

from __future__ import annotations

from collections.abc import Callable

POLICY_TOKEN_MASK_REGISTRY: dict[str, tuple[Callable, tuple[str, ...]]] = {}


def register_policy_token_mask(name: str, required_fields: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Register ``fn(batch, config, dp_group) -> (keep, metrics)`` as ``actor.policy_loss.token_mask=<name>``, run per
    optimizer mini-batch on every rank. ``batch``: the ``required_fields``, tensors padded to (bs, T) on the group's
    device; ``config``: the ``ActorConfig``; ``dp_group``: None for one process; ``keep``: (bs, T) bool, the tokens of
    the policy-gradient term; ``metrics``: ``{name: float}``."""

    def decorator(fn: Callable) -> Callable:
        POLICY_TOKEN_MASK_REGISTRY[name] = (fn, tuple(required_fields))
        return fn

    return decorator


def get_policy_token_mask(name: str) -> tuple[Callable, tuple[str, ...]]:
    """``(fn, required_fields)`` of the mask registered as ``name``; ValueError listing the registered names if none."""
    if name not in POLICY_TOKEN_MASK_REGISTRY:
        registered = list(POLICY_TOKEN_MASK_REGISTRY)
        raise ValueError(f"Unsupported policy token mask: {name}. Supported masks are: {registered}")
    return POLICY_TOKEN_MASK_REGISTRY[name]
