"""What a job asks of the plugin, decided from the job's config; and the audit record of the wrappers that acted.

A cluster image installs the plugin once, and verl's ``verl.plugins`` entry point then imports it into every process
of every job: the driver, the TaskRunner, every Ray worker. A job that asks for nothing must run verl 0.9.1's own
code. So every wrapper of :data:`stapo_verl.integration.verl_0_9_1.PATCHES` starts with :func:`request_of` (or, for a
wrapped function whose config is an argument, :func:`job_request`) and, when the job asks for nothing it does, hands
verl's original its own arguments and returns the original's result untouched: nothing reorders, reseeds, gathers,
counts or logs.

A job asks for the plugin with either of:

* **a policy token mask**: ``actor_rollout_ref.actor.policy_loss.loss_mode=stapo`` or a ``token_mask`` (the mask
  pre-pass, the masked policy-gradient term, the diagnostics and their driver state);
* **same seed, same run** (:data:`REPRODUCIBLE_KEY`, ``+trainer.reproducible=True``, for any loss): a per-request
  rollout seed and the training batch in a canonical order (:mod:`.determinism`).

Beyond the mask, each of the plugin's options is asked for by its own key and loaded only then: the diagnostics
(``policy_loss.mask_statistics``, ``policy_loss.dump_tokens``; :func:`asks_for_diagnostics`), the reproducibility
switch, ``stats_source=current_minibatch`` and the ``s2t_random`` ablation (:func:`asks_for_extras`). The options
with driver-side wrappers (the diagnostics in the trainer, the switch in the trainer and the agent loop) reach the
Ray processes as :data:`OPT_INS_ENV`, which the ``validate_config`` wrapper sets on the driver before Ray starts (as
verl's ``run_ppo`` passes ``VERL_FULL_DETERMINISM``); the plugin installs their wrappers at load when it names them
(:func:`opt_ins_from_env`).

The decision reads the job's config (the environment only says which wrappers to install), once per verl object that lives as long as the job
in its process (trainer, agent-loop worker), cached on it like the rest of the plugin's per-object state.

**The audit record.** With ``STAPO_AUDIT_DIR=<dir>`` in a process's environment, each wrapper that acts (not a
pass-through) creates the file ``<dir>/<pid>.<symbol>`` (``symbol``: its ledger entry's). The directory of a job that
asked for nothing stays empty in every process; that is how a cluster team checks that the plugin left a job alone
(``tests/e2e/test_tiny_grpo.py`` does it on the tiny GRPO baseline). Only the acting path reads the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

#: the switch of same seed, same run (a verl trainer key; not declared in verl's ``ppo_trainer.yaml``, so ``+``)
REPRODUCIBLE_KEY = "trainer.reproducible"
#: the environment variable naming the audit record's directory (unset: no record)
AUDIT_ENV = "STAPO_AUDIT_DIR"
#: the options whose wrappers a process installs at plugin load, comma-separated (:func:`opt_ins_from_env`)
OPT_INS_ENV = "STAPO_VERL_OPT_INS"
#: the options with wrappers of their own, in install order
OPT_INS = ("diagnostics", "reproducible")
#: where the decision is cached on a verl object (ledger: the ``state kept on the instance`` entries)
REQUEST_ATTR = "_stapo_request"
_POLICY_LOSS = "actor_rollout_ref.actor.policy_loss"
#: loss modes of earlier stapo-verl versions → the ``token_mask`` that replaces them (with ``loss_mode=vanilla``); a
#: job naming one asks for the plugin, whose config class refuses it with one line naming the replacement
REPLACED_LOSS_MODES = MappingProxyType({
    "stapo_high_entropy": "s2t_high_entropy",
    "stapo_random": "s2t_random",
    "stapo_full_mask": "s2t_full",
    "top_entropy": "top_entropy",
})


class TokenMaskIntegrationError(RuntimeError):
    """A token mask is configured, but this worker cannot apply it (its loss is not verl's ``ppo_loss``)."""


@dataclass(frozen=True)
class JobRequest:
    """What one job asks of the plugin.

    Attributes:
        masked: the policy-loss config asks for a token mask (``loss_mode=stapo``, a ``token_mask``, or a loss mode
            of an earlier stapo-verl version that a mask replaced; :func:`asks_for_mask`).
        reproducible: :data:`REPRODUCIBLE_KEY` is true.
        diagnostics: the masked job asks for the diagnostics (:func:`asks_for_diagnostics`).
    """

    masked: bool = False
    reproducible: bool = False
    diagnostics: bool = False

    @property
    def asks(self) -> bool:
        """Whether the job asks for anything of the plugin."""
        return self.masked or self.reproducible


def _get(config, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def asks_for_mask(policy_loss) -> bool:
    """The one rule of whether a job asks for a policy token mask, which every wrapper applies (through
    :func:`job_request` on the driver and the agent loop, directly on the worker's config and in ``ppo_loss``).

    Args:
        policy_loss: the actor's ``policy_loss`` node: an OmegaConf ``DictConfig``, a mapping, or verl's
            ``PolicyLossConfig`` (or the plugin's subclass).

    Returns:
        True for ``loss_mode=stapo``, a ``token_mask``, or a loss mode an earlier version had
        (:data:`REPLACED_LOSS_MODES`, refused with the fix when the config is built). Raises nothing.
    """
    loss_mode = _get(policy_loss, "loss_mode", "vanilla")
    return loss_mode == "stapo" or loss_mode in REPLACED_LOSS_MODES or _get(policy_loss, "token_mask") is not None


def asks_for_diagnostics(policy_loss) -> bool:
    """Whether a masked job asks for the diagnostics (``mask_statistics`` or ``dump_tokens``; default off). Same
    argument as :func:`asks_for_mask`; raises nothing."""
    return asks_for_mask(policy_loss) and bool(_get(policy_loss, "mask_statistics", False) or
                                               _get(policy_loss, "dump_tokens", False))


def asks_for_extras(policy_loss) -> bool:
    """Whether the mask pre-pass needs the plugin's options around it (:mod:`.training_worker`): the diagnostics,
    ``stats_source=current_minibatch`` or ``token_mask=s2t_random`` (it reads the mini-batch index). Raises
    nothing."""
    return asks_for_diagnostics(policy_loss) or (asks_for_mask(policy_loss) and (
        _get(policy_loss, "stats_source") == "current_minibatch" or _get(policy_loss, "token_mask") == "s2t_random"))


def opt_ins_of(config) -> tuple[str, ...]:
    """The options of :data:`OPT_INS` a full trainer config asks for (raises as :func:`reproducible_of`)."""
    policy_loss = _get(config, _POLICY_LOSS)
    asked = {"diagnostics": policy_loss is not None and asks_for_diagnostics(policy_loss),
             "reproducible": reproducible_of(config)}
    return tuple(name for name in OPT_INS if asked[name])


def opt_ins_from_env() -> tuple[str, ...]:
    """The options :data:`OPT_INS_ENV` names (unknown names are ignored; unset: none)."""
    named = {n.strip() for n in os.environ.get(OPT_INS_ENV, "").split(",")}
    return tuple(name for name in OPT_INS if name in named)


def reproducible_of(config) -> bool:
    """The value of :data:`REPRODUCIBLE_KEY` in a full trainer config (False when absent).

    Args:
        config: the job's trainer config (OmegaConf ``DictConfig`` of ``ppo_trainer``, or any mapping of mappings).

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError: the value is not a boolean (e.g. ``"yes"`` or ``1``); the
            message names the key, the value, what is allowed and the fix.
    """
    value = _get(config, REPRODUCIBLE_KEY, False)
    if isinstance(value, bool):
        return value
    from stapo_verl.algo.config_ranges import StapoConfigError

    raise StapoConfigError(
        f"{REPRODUCIBLE_KEY}={value!r}: allowed true or false (same seed, same run: per-request rollout seeds and "
        f"a canonical batch order). Fix: +{REPRODUCIBLE_KEY}=True, or drop the override",
        key=REPRODUCIBLE_KEY, value=value, allowed="true or false",
    )


def job_request(config) -> JobRequest:
    """What a job asks of the plugin, from its full trainer config.

    Args:
        config: the job's trainer config (``DictConfig`` of ``ppo_trainer``), as the driver composes it and Ray
            ships it to the TaskRunner and the workers.

    Returns:
        The :class:`JobRequest`; ``JobRequest()`` (asks for nothing) for verl's defaults.

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError: :data:`REPRODUCIBLE_KEY` is not a boolean.
    """
    policy_loss = _get(config, _POLICY_LOSS)
    return JobRequest(masked=policy_loss is not None and asks_for_mask(policy_loss),
                      reproducible=reproducible_of(config),
                      diagnostics=policy_loss is not None and asks_for_diagnostics(policy_loss))


def request_of(obj, config) -> JobRequest:
    """:func:`job_request` of ``config``, decided once per verl object and cached on it (:data:`REQUEST_ATTR`).

    Args:
        obj: the verl object whose method a wrapper replaces (``PPOTrainer``, ``AgentLoopWorker``); it lives as long
            as the job does in its process.
        config: that object's full trainer config (``obj.config``).
    """
    cached = obj.__dict__.get(REQUEST_ATTR)
    if cached is None:
        cached = obj.__dict__[REQUEST_ATTR] = job_request(config)
    return cached


def record_acted(symbol: str) -> None:
    """Add ``symbol`` (a ledger entry's) to this process's audit record when ``STAPO_AUDIT_DIR`` is set: the file
    ``<dir>/<pid>.<symbol>``, created once (later calls open it for append and write nothing). Called by a wrapper
    on its acting path only. Raises OSError when the directory is not writable."""
    directory = os.environ.get(AUDIT_ENV)
    if directory:
        with open(os.path.join(directory, f"{os.getpid()}.{symbol}"), "a", encoding="utf-8"):
            pass
