"""The launcher's errors before Ray: one message each, naming the key, the value, what is allowed and the fix.

* :func:`verl_gate_message`: the installed verl is not the one the plugin was written for (the first line on
  screen, before anything composes: with another verl the plugin stays inactive, so even the CPU platform is unknown
  and Hydra would report only that);
* :func:`config_error_message`: a config value the plugin's config refuses, with the default and the override that
  fixes it, taken from the refused key's range (:data:`stapo_verl.algo.config_ranges.RANGES`) and its default (the
  field of :class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig`), never from a list
  of key names here;
* :func:`validate_policy_loss`: builds the policy-loss config on the composed config, as verl's ``validate_config``
  would after Hydra, so a bad value is reported once, without Hydra's dump of every override.

Composition errors, config errors and a verl mismatch all exit with :data:`EXIT_CONFIG`.
"""

from __future__ import annotations

import copy
import dataclasses

#: exit status of ``python -m stapo_verl.launch.train`` / ``preflight`` for a config that does not compose, a value
#: the config refuses, bad data or a verl the plugin was not written for: nothing was started
EXIT_CONFIG = 2


def verl_gate_message(problems: list[str], allowed_anyway: bool) -> str | None:
    """The one line for a verl the plugin was not written for, or None (no problem, or the override is set).

    Args:
        problems: :func:`stapo_verl.integration.verl_0_9_1.mismatches` (the version line first when it differs).
        allowed_anyway: ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` is set.
    """
    from stapo_verl.integration.verl_0_9_1 import ALLOW_ENV, VERL_VERSION

    if not problems or allowed_anyway:
        return None
    return (f"{problems[0]}" + (f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else "")
            + f": the plugin stays inactive, so nothing of stapo-verl (CPU platform, masks, loss_mode=stapo) exists in "
            f"this process. Fix: pip install verl=={VERL_VERSION}; or, at your own risk, {ALLOW_ENV}=1")


def installed_verl_problems() -> list[str]:
    """:func:`stapo_verl.integration.verl_0_9_1.mismatches` of the verl on this path (reads verl's files only)."""
    from stapo_verl.integration.verl_0_9_1 import mismatches

    return mismatches()


def default_of(key: str):
    """The default of a policy-loss key (``actor_rollout_ref.actor.policy_loss.<name>``) in
    :class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig`; raises KeyError for a key it
    does not have."""
    from stapo_verl.algo.config_ranges import KEY
    from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig

    name = key[len(KEY) + 1:] if key.startswith(KEY + ".") else key
    for f in dataclasses.fields(StapoPolicyLossConfig):
        if f.name == name and f.default is not dataclasses.MISSING:
            return f.default
    raise KeyError(key)


def config_cause(exc: BaseException) -> BaseException:
    """The plugin's ``StapoConfigError`` in ``exc``'s cause chain (Hydra's ``instantiate`` wraps it), else ``exc``."""
    from stapo_verl.algo.config_ranges import StapoConfigError

    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, StapoConfigError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return exc


def _passes(name: str, value) -> bool:
    """True when ``value`` is allowed for the policy-loss key ``name`` (its range in
    :data:`stapo_verl.algo.config_ranges.RANGES` or the diagnostics'; a key without one allows any value of its
    type)."""
    from stapo_verl.algo.config_ranges import RANGES
    from stapo_verl.diagnostics.config import DIAGNOSTICS_RANGES

    rule = RANGES.get(name) or DIAGNOSTICS_RANGES.get(name)
    try:
        return rule is None or bool(rule.test(value))
    except TypeError:
        return False


def _renamed_fix(key: str, value) -> str | None:
    """The fix for a renamed policy-loss key (``tau_p`` → ``s2t_tau_p``): drop the old key and set the new one, to
    ``value`` when the new key allows it, else to the new key's default. None when ``key`` was not renamed."""
    from stapo_verl.algo.config_ranges import KEY
    from stapo_verl.integration.verl_0_9_1.policy_loss.checks import RENAMED_KEYS

    old = key[len(KEY) + 1:] if key.startswith(KEY + ".") else key
    new = RENAMED_KEYS.get(old)
    if new is None:
        return None
    try:
        keep = value is not None and _passes(new, float(value))
    except (TypeError, ValueError):
        keep = False
    target = float(value) if keep else default_of(f"{KEY}.{new}")
    why = "" if keep else f" ({value} is outside the new key's range; its default)"
    return f"remove {key} and set {KEY}.{new}={target}{why}"


def renamed_override(overrides: list[str]) -> str | None:
    """The one error line (:func:`config_error_message`) for an override of a renamed policy-loss key (``tau_p``, with
    or without ``+``), which the config no longer declares, so Hydra alone would refuse it without naming the new key;
    None when no override names one."""
    import yaml

    from stapo_verl.algo.config_ranges import KEY, StapoConfigError
    from stapo_verl.integration.verl_0_9_1.policy_loss.checks import RENAMED_KEYS, check_renamed_keys

    for item in overrides:
        key, sep, value = item.lstrip("+~").partition("=")
        name = key[len(KEY) + 1:] if key.startswith(KEY + ".") else None
        if sep and name in RENAMED_KEYS:
            try:
                check_renamed_keys({name: yaml.safe_load(value)})
            except StapoConfigError as exc:
                return config_error_message(exc)
    return None


def config_error_message(exc: BaseException) -> str:
    """One line for a config error: its message and, when it names one key, the fix, a value that passes the check
    (``StapoConfigError.key`` / ``.allowed``, :mod:`stapo_verl.algo.config_ranges`): for a renamed key the new key
    with the value given (or its default when the value is out of the new key's range), for another key its
    default. The raiser's own ``Fix:`` is replaced by this one, so the line has one."""
    exc = config_cause(exc)
    text = " ".join(str(exc).split())
    key, allowed = getattr(exc, "key", None), getattr(exc, "allowed", None)
    if key is None:
        return text
    renamed = _renamed_fix(key, getattr(exc, "value", None))
    if renamed is not None:
        return f"{text.split(' Fix: ')[0]} Fix: {renamed}"
    try:
        default = default_of(key)
    except KeyError:
        return text
    default = "null" if default is None else default
    other = f" or another value with {allowed}" if allowed else ""
    return f"{text.split(' Fix: ')[0]}; default {default}. Fix: {key}={default}{other}"


def validate_policy_loss(config) -> None:
    """Build the policy-loss config of ``config`` (a copy) as verl's ``validate_config`` does: the plugin fills
    ``_target_`` (:func:`stapo_verl.integration.verl_0_9_1.policy_loss.checks.fill_policy_loss_target`), then verl's
    ``omega_conf_to_dataclass``.

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError: a value the plugin's config refuses.
        Whatever verl's ``PolicyLossConfig`` raises.
    """
    from verl.utils.config import omega_conf_to_dataclass

    from stapo_verl.integration.verl_0_9_1.policy_loss.checks import fill_policy_loss_target

    config = copy.deepcopy(config)
    fill_policy_loss_target(config)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor.policy_loss)
