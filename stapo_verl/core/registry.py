"""Registry of policy token masks: per-token selections applied to the policy-gradient term of any policy loss.

This is the extension point the upstream series adds to ``verl/trainer/ppo/core_algos.py`` next to
``POLICY_LOSS_REGISTRY`` / ``register_policy_loss`` (the definitions below are copied there verbatim by
``upstream/build_series.py``; CI fails when the two drift). A mask is selected with
``actor_rollout_ref.actor.policy_loss.token_mask=<name>``; ``null`` (the default) changes nothing.

A mask function is called once per optimizer mini-batch, on every rank, before the engine counts the mini-batch's
tokens (:func:`stapo_verl.core.losses.apply_policy_token_mask`)::

    fn(batch: dict[str, Any], config: ActorConfig, dp_group) -> (keep (bs, T) bool, metrics dict[str, float])

``batch`` holds exactly the fields the mask declared at registration: tensors in the padded response layout
(bs, T) of ``ppo_loss`` (``TensorDict.to_padded_tensor``), non-tensor entries (e.g. ``global_steps``) as Python
values. ``dp_group`` is the data-parallel group whose ranks together hold the mini-batch. ``keep`` selects the
tokens that enter the policy-gradient numerator and its token-mean denominator; the KL and entropy terms keep
``response_mask``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PolicyTokenMaskFn = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


@dataclass(frozen=True)
class PolicyTokenMask:
    """A registered policy token mask.

    Attributes:
        name: the value of ``policy_loss.token_mask`` that selects it.
        fn: ``fn(batch, config, dp_group) -> (keep (bs, T) bool, metrics)``.
        required_fields: the mini-batch fields ``fn`` reads; the pre-pass raises naming any that is missing.
    """

    name: str
    fn: PolicyTokenMaskFn
    required_fields: tuple[str, ...]


POLICY_TOKEN_MASK_REGISTRY: dict[str, PolicyTokenMask] = {}


def register_policy_token_mask(
    name: str, required_fields: tuple[str, ...]
) -> Callable[[PolicyTokenMaskFn], PolicyTokenMaskFn]:
    """Register a policy token mask under ``name`` (decorator).

    Args:
        name: the value of ``actor_rollout_ref.actor.policy_loss.token_mask`` that selects the mask.
        required_fields: the mini-batch fields (``TensorDict`` keys) the mask reads, e.g.
            ``("old_log_probs", "entropy", "advantages", "response_mask")``.

    Returns:
        The decorator; it returns the function unchanged.

    Raises:
        ValueError: ``name`` is already registered to a different function (re-registering the same function,
            e.g. after a module reload, replaces the entry).
    """

    def decorator(fn: PolicyTokenMaskFn) -> PolicyTokenMaskFn:
        existing = POLICY_TOKEN_MASK_REGISTRY.get(name)
        qualname = f"{fn.__module__}.{fn.__qualname__}"
        if existing is not None and f"{existing.fn.__module__}.{existing.fn.__qualname__}" != qualname:
            raise ValueError(
                f"policy token mask {name!r} is already registered to "
                f"{existing.fn.__module__}.{existing.fn.__qualname__}; cannot register {qualname}"
            )
        POLICY_TOKEN_MASK_REGISTRY[name] = PolicyTokenMask(name=name, fn=fn, required_fields=tuple(required_fields))
        return fn

    return decorator


def get_policy_token_mask(name: str) -> PolicyTokenMask:
    """Return the policy token mask registered under ``name``.

    Args:
        name: the value of ``policy_loss.token_mask``.

    Returns:
        The :class:`PolicyTokenMask`.

    Raises:
        ValueError: no mask is registered under ``name`` (the message lists the registered names).
    """
    if name not in POLICY_TOKEN_MASK_REGISTRY:
        raise ValueError(
            f"Unsupported policy token mask: {name}. Supported masks are: {list(POLICY_TOKEN_MASK_REGISTRY.keys())}"
        )
    return POLICY_TOKEN_MASK_REGISTRY[name]
