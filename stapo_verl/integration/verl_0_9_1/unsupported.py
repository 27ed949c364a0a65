"""The gate's verdicts on a verl the plugin was not written for (imported only then): :func:`check_verl`, the messages
of the gate of :mod:`stapo_verl.integration.verl_0_9_1`, and the ``loss_mode=stapo`` stand-in a job that asks for the
plugin fails through (:func:`register_stand_ins`)."""

from __future__ import annotations

import logging
import warnings

from stapo_verl.integration import verl_0_9_1 as gate
from stapo_verl.integration.verl_0_9_1 import ALLOW_ENV, VERL_VERSION, IncompatibleVerlError

logger = logging.getLogger("stapo_verl.integration.verl_0_9_1")


def _plugin_version() -> str:
    from stapo_verl import __version__

    return __version__


def describe_mismatch(problems: list[str]) -> str:
    """``stapo-verl <v> is written for verl 0.9.1; found verl <found>``, and the first differing symbol when the
    version alone does not explain ``problems`` (:func:`~stapo_verl.integration.verl_0_9_1.mismatches`, non-empty)."""
    symbols = [p for p in problems if not p.startswith("verl ")]
    return (
        f"stapo-verl {_plugin_version()} is written for verl {VERL_VERSION}; found verl {gate.installed_verl_version()}"
        + (f" (first differing symbol: {symbols[0]})" if symbols and len(symbols) == len(problems) else "")
    )


def unsupported_verl_error(asked_by: str, problems: list[str] | None = None) -> IncompatibleVerlError:
    """The :class:`IncompatibleVerlError` (returned) for ``asked_by`` (e.g. ``"...policy_loss.loss_mode='stapo'"``):
    both versions, the first differing symbol, the fix and the override; ``problems``: ``gate.mismatches()`` if known."""
    problems = gate.mismatches() if problems is None else problems
    return IncompatibleVerlError(
        f"{asked_by} needs stapo-verl's verl integration, which is not loaded: {describe_mismatch(problems)}. "
        f"Install verl=={VERL_VERSION}; or, at your own risk, set {ALLOW_ENV}=1 in every process of the job (the "
        "driver and the Ray workers) to load it anyway."
    )


def inactive_warning(problems: list[str]) -> str:
    return (
        f"{describe_mismatch(problems)}: the plugin stays inactive (nothing in verl is patched, no CPU platform); "
        f"jobs without loss_mode=stapo or a token_mask run as without it, jobs with them fail. Install "
        f"verl=={VERL_VERSION}, or set {ALLOW_ENV}=1 to load it anyway."
    )


def warn_override(problems: list[str]) -> None:
    message = f"{describe_mismatch(problems)}. Loading it anyway because {ALLOW_ENV}=1, at your own risk"
    warnings.warn(f"{message}. All differences: {problems}", stacklevel=3)
    logger.warning("%s.", message)


def unsupported_verl_policy_loss(*args, **kwargs):
    """``loss_mode=stapo`` on a verl the plugin was not written for (registered with verl's public
    ``register_policy_loss``). Raises IncompatibleVerlError, always."""
    raise unsupported_verl_error("actor_rollout_ref.actor.policy_loss.loss_mode='stapo'")


def register_stand_ins(register_hydra_options) -> None:
    """What the plugin registers on a verl it was not written for, through public registration APIs only: Hydra's
    actor options (``register_hydra_options()``; a recipe that selects one composes, and its ``_target_``,
    :class:`.policy_loss.config.StapoPolicyLossConfig`, raises the version error when verl builds the config), and
    ``loss_mode=stapo`` as :func:`unsupported_verl_policy_loss`. A failure (a verl without these public names) is
    logged: a job asking for the plugin then fails with verl's or Hydra's own error after the warning line."""
    try:
        from verl.trainer.ppo.core_algos import register_policy_loss

        register_hydra_options()  # its import of stapo_verl.core.masks registers the real "stapo": replaced below
        register_policy_loss("stapo")(unsupported_verl_policy_loss)
    except Exception as e:  # the gate must never break a job that does not ask for the plugin
        logger.warning("stapo-verl could not register its version-error stand-ins: %s: %s", type(e).__name__, e)


def check_verl(asked_by: str = "this job") -> None:
    """The gate: raise unless the installed verl matches the ledger (:func:`~stapo_verl.integration.verl_0_9_1.mismatches`)
    or the override is set.

    Raises:
        IncompatibleVerlError: naming ``asked_by`` (:func:`unsupported_verl_error`). With
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` the call warns loudly (every difference listed) and returns.
    """
    raise_unless_allowed(gate.mismatches(), asked_by)


def raise_unless_allowed(problems: list[str], asked_by: str) -> None:
    """Raise :func:`unsupported_verl_error` for ``problems`` (ledger differences), or warn with the override."""
    if problems and not gate.allowed_anyway():
        raise unsupported_verl_error(asked_by, problems)
    if problems:
        warn_override(problems)
