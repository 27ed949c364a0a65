"""Registry of policy token masks: per-token selections applied to the policy-gradient term of any policy loss.

This is the extension point the upstream series adds to ``verl/trainer/ppo/core_algos.py`` next to
``POLICY_LOSS_REGISTRY`` / ``register_policy_loss`` (the definitions below are copied there verbatim by
``upstream/build_series.py``; CI fails when the two drift). A mask is selected with
``actor_rollout_ref.actor.policy_loss.token_mask=<name>``; ``null`` (the default) changes nothing. The pre-pass that
calls it is :func:`stapo_verl.core.losses.apply_policy_token_mask`. Like ``register_policy_loss``, registering a name
again replaces the earlier entry.
"""

from __future__ import annotations

from collections.abc import Callable

POLICY_TOKEN_MASK_REGISTRY: dict[str, tuple[Callable, tuple[str, ...]]] = {}


def register_policy_token_mask(name: str, required_fields: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Register ``fn(batch, config, dp_group) -> (keep, metrics)`` as ``actor.policy_loss.token_mask=<name>``.

    It runs once per optimizer mini-batch on every rank before the engine splits it. ``batch``: the
    ``required_fields``, tensors padded to (bs, T) on the device of the group's collectives; ``config``: the
    ``ActorConfig``; ``dp_group``: the data-parallel group (None: one process); ``keep``: (bs, T) bool, the tokens of
    the policy-gradient term; ``metrics``: ``{name: float}``.
    """

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
