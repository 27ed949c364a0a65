"""Registry of policy token masks: per-token selections applied to the policy-gradient term of any policy loss.

This is the extension point the upstream series adds to ``verl/trainer/ppo/core_algos.py`` next to
``POLICY_LOSS_REGISTRY`` / ``register_policy_loss`` (the definitions below are copied there verbatim by
``upstream/build_series.py``; CI fails when the two drift). A mask is selected with
``actor_rollout_ref.actor.policy_loss.token_mask=<name>``; ``null`` (the default) changes nothing. The pre-pass that
calls it is :func:`stapo_verl.core.losses.apply_policy_token_mask`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyTokenMask:
    """A registered policy token mask: ``fn`` and the mini-batch fields it reads (``required_fields``)."""

    fn: Callable
    required_fields: tuple[str, ...]


POLICY_TOKEN_MASK_REGISTRY: dict[str, PolicyTokenMask] = {}


def register_policy_token_mask(name: str, required_fields: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """Register a policy token mask, selected with ``actor.policy_loss.token_mask=<name>`` (decorator).

    ``fn(batch, config, dp_group) -> (keep, metrics)`` runs once per optimizer mini-batch on every rank, before the
    engine splits it (``apply_policy_token_mask``). ``batch``: the ``required_fields``, tensors padded to (bs, T) on
    the device of the group's collectives; ``config``: the ``ActorConfig``; ``dp_group``: the data-parallel group
    holding the mini-batch (None: one process); ``keep``: (bs, T) bool, the tokens of the policy-gradient term;
    ``metrics``: ``{name: float}``. The mask's own ``policy_loss`` keys are validated by ``PolicyLossConfig``.

    Raises:
        ValueError: ``name`` is registered to another function (the same function may re-register).
    """

    def decorator(fn: Callable) -> Callable:
        existing = POLICY_TOKEN_MASK_REGISTRY.get(name)
        qualname = f"{fn.__module__}.{fn.__qualname__}"
        if existing is not None and f"{existing.fn.__module__}.{existing.fn.__qualname__}" != qualname:
            raise ValueError(f"policy token mask {name!r} is already registered; cannot register {qualname}")
        POLICY_TOKEN_MASK_REGISTRY[name] = PolicyTokenMask(fn, tuple(required_fields))
        return fn

    return decorator


def get_policy_token_mask(name: str) -> PolicyTokenMask:
    """The :class:`PolicyTokenMask` registered under ``name``.

    Raises:
        ValueError: no mask is registered under ``name`` (the message lists the registered names).
    """
    if name not in POLICY_TOKEN_MASK_REGISTRY:
        registered = list(POLICY_TOKEN_MASK_REGISTRY)
        raise ValueError(f"Unsupported policy token mask: {name}. Supported masks are: {registered}")
    return POLICY_TOKEN_MASK_REGISTRY[name]
