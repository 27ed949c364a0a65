"""What a job asks of the plugin, from its config: the one rule every wrapper applies (:func:`asks_for_mask`) and
each option's own key, loaded only when asked (the diagnostics, ``+trainer.reproducible=True``, the worker-side
extras); the options reach other Ray processes as :data:`OPT_INS_ENV`, set on the driver before Ray starts. The audit
record: :func:`record_acted`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

REPRODUCIBLE_KEY = "trainer.reproducible"
AUDIT_ENV = "STAPO_AUDIT_DIR"
#: the options whose wrappers a process installs at plugin load, comma-separated (:func:`opt_ins_from_env`)
OPT_INS_ENV = "STAPO_VERL_OPT_INS"
OPT_INS = ("diagnostics", "reproducible")
#: where :func:`request_of` caches the decision on a verl object
REQUEST_ATTR = "_stapo_request"
_POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
#: loss modes of earlier stapo-verl versions → the ``token_mask`` that replaced them; the config refuses them in one line
REPLACED_LOSS_MODES = MappingProxyType({"stapo_high_entropy": "s2t_high_entropy", "stapo_random": "s2t_random",
                                        "stapo_full_mask": "s2t_full", "top_entropy": "top_entropy"})


class TokenMaskIntegrationError(RuntimeError):
    """A token mask is configured, but this worker cannot apply it (its loss is not verl's ``ppo_loss``)."""


@dataclass(frozen=True)
class JobRequest:
    """What one job asks (:func:`asks_for_mask`, :data:`REPRODUCIBLE_KEY`, :func:`asks_for_diagnostics`)."""

    masked: bool = False
    reproducible: bool = False
    diagnostics: bool = False


def config_value(config, dotted: str, default=None):
    """``config``'s value at the dotted key (a mapping, ``DictConfig`` or object at each level); ``default`` if None."""
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def asks_for_mask(policy_loss) -> bool:
    """The one rule: ``loss_mode=stapo``, a ``token_mask``, or a replaced loss mode (refused with the fix when the
    config is built). ``policy_loss``: a ``DictConfig``, a mapping or a ``PolicyLossConfig``. Raises nothing."""
    loss_mode = config_value(policy_loss, "loss_mode", "vanilla")
    token_mask = config_value(policy_loss, "token_mask")
    return loss_mode == "stapo" or loss_mode in REPLACED_LOSS_MODES or token_mask is not None


def asks_for_diagnostics(policy_loss) -> bool:
    """A masked job with ``mask_statistics`` or ``dump_tokens`` (both default off). Raises nothing."""
    return asks_for_mask(policy_loss) and bool(config_value(policy_loss, "mask_statistics", False) or
                                               config_value(policy_loss, "dump_tokens", False))


def asks_for_extras(policy_loss) -> bool:
    """Whether the mask pre-pass needs the plugin's options around it (:mod:`.training_worker`): the diagnostics,
    ``stats_source=current_minibatch`` or ``token_mask=s2t_random`` (it reads the mini-batch index). Raises nothing."""
    extras = (config_value(policy_loss, "stats_source") == "current_minibatch"
              or config_value(policy_loss, "token_mask") == "s2t_random")
    return asks_for_diagnostics(policy_loss) or (asks_for_mask(policy_loss) and extras)


def reproducible_of(config) -> bool:
    """:data:`REPRODUCIBLE_KEY` of a full trainer config (False when absent); raises
    :class:`~stapo_verl.algo.config_ranges.StapoConfigError` when it is not a boolean, naming the fix."""
    value = config_value(config, REPRODUCIBLE_KEY, False)
    if isinstance(value, bool):
        return value
    from stapo_verl.algo.config_ranges import StapoConfigError

    raise StapoConfigError(f"{REPRODUCIBLE_KEY}={value!r}: allowed true or false (same seed, same run). Fix: "
                           f"+{REPRODUCIBLE_KEY}=True, or drop the override", key=REPRODUCIBLE_KEY, value=value,
                           allowed="true or false")


def job_request(config) -> JobRequest:
    """The :class:`JobRequest` of a full trainer config (raises as :func:`reproducible_of`)."""
    policy_loss = config_value(config, _POLICY_LOSS)
    return JobRequest(masked=policy_loss is not None and asks_for_mask(policy_loss),
                      reproducible=reproducible_of(config),
                      diagnostics=policy_loss is not None and asks_for_diagnostics(policy_loss))


def opt_ins_from_env() -> tuple[str, ...]:
    """The options :data:`OPT_INS_ENV` names (unknown names ignored; unset: none)."""
    named = {n.strip() for n in os.environ.get(OPT_INS_ENV, "").split(",")}
    return tuple(name for name in OPT_INS if name in named)


def request_of(obj, config) -> JobRequest:
    """:func:`job_request` of ``config``, decided once per verl object (trainer, agent-loop worker) and cached on it."""
    cached = obj.__dict__.get(REQUEST_ATTR)
    if cached is None:
        cached = obj.__dict__[REQUEST_ATTR] = job_request(config)
    return cached


def record_acted(symbol: str) -> None:
    """With ``STAPO_AUDIT_DIR=<dir>``, create ``<dir>/<pid>.<symbol>`` (a wrapper's acting path; the ledger symbol).
    Raises OSError when the directory is not writable."""
    directory = os.environ.get(AUDIT_ENV)
    if directory:
        with open(os.path.join(directory, f"{os.getpid()}.{symbol}"), "a", encoding="utf-8"):
            pass
