"""STAPO hyperparameters under ``actor_rollout_ref.actor.policy_loss`` (a ``_target_`` subclass of verl's config).

Usage (verl Hydra override syntax; ``+`` because verl's ``actor.yaml`` does not declare these keys)::

    actor_rollout_ref.actor.policy_loss._target_=stapo_verl.config.StapoPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=stapo
    +actor_rollout_ref.actor.policy_loss.tau_p=0.002
    +actor_rollout_ref.actor.policy_loss.entropy_quantile=0.75

Source: spec §0/§2 (defaults), verl ``verl/workers/config/actor.py`` (``PolicyLossConfig``).
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass

from verl.workers.config.actor import PolicyLossConfig

from stapo_verl import STAPO_LOSS_MODES

STATS_SOURCES = ("old_policy", "current_minibatch", "current_micro_batch")
#: statistics sources whose mask is computed by the worker hook before the micro-batch loop (exact renormalisation)
MINIBATCH_STATS_SOURCES = ("old_policy", "current_minibatch")
TOP_ENTROPY_NORMALIZERS = ("kept", "all_tokens")
_KEY = "actor_rollout_ref.actor.policy_loss"


class StapoConfigError(ValueError):
    """Raised for an invalid STAPO config value; the message names the key and the allowed range."""


class StapoNotRegisteredError(RuntimeError):
    """Raised when ``loss_mode`` names a stapo-verl loss that is not registered in this process."""


def _not_registered_message(loss_mode: str) -> str:
    return (
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} is a stapo-verl loss, but it is not "
        f"registered in this process (pid {os.getpid()}). verl loads plugins through the 'verl.plugins' entry "
        "point and silently ignores import errors. Fix: `pip install -e <stapo-verl checkout>` (or the wheel) "
        "in the Python environment of EVERY node; do not set VERL_USE_EXTERNAL_PLUGINS=none (or include "
        "'stapo' in its list); check `python -c 'import stapo_verl.plugin'` for an import error; as a "
        "fallback pass +ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=stapo_verl.plugin."
    )


def _coerce_scalar(name: str, value, kind: type):
    """Return ``value`` as ``kind`` (float/int/bool/str), coercing numeric strings exactly; raise otherwise.

    A Hydra override with a quoted value (``+...policy_loss.tau_p='0.002'``) arrives as the string "0.002".
    Numeric strings are parsed with Python's ``float``/``int`` (the same literal Hydra would have parsed
    unquoted, so the coercion is exact); booleans are never accepted as numbers (``True`` is not 1.0), and
    floats are never truncated to ints.

    Raises:
        StapoConfigError: naming ``actor_rollout_ref.actor.policy_loss.<name>``, the value and the allowed type.
    """
    def fail(allowed: str):
        raise StapoConfigError(f"{_KEY}.{name}={value!r} ({type(value).__name__}): allowed {allowed}")

    if kind is bool:
        return value if isinstance(value, bool) else fail("a bool (true/false, unquoted)")
    if kind is str:
        return value if isinstance(value, str) else fail("a string")
    if isinstance(value, bool):
        fail(f"a {kind.__name__} (a bool is not a number)")
    if kind is float:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        fail("a float or a numeric string such as '0.002'")
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip(), 10)
            except ValueError:
                pass
        fail("an int or an integer string such as '7' (no fractional part)")
    return value


def _scalar_kind(annotation) -> tuple[type | None, bool]:
    """(float/int/bool/str or None, whether None is allowed) for a dataclass field annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and non_none[0] in (float, int, bool, str):
            return non_none[0], True
        return None, False
    return (annotation, False) if annotation in (float, int, bool, str) else (None, False)


def check_registered(loss_mode: str) -> None:
    """Raise :class:`StapoNotRegisteredError` if ``loss_mode`` is ours but absent from verl's registry.

    Args:
        loss_mode: the ``policy_loss.loss_mode`` string.
    Raises:
        StapoNotRegisteredError: ``loss_mode`` in :data:`stapo_verl.STAPO_LOSS_MODES` and not in
            ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``.
    """
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if loss_mode in STAPO_LOSS_MODES and loss_mode not in POLICY_LOSS_REGISTRY:
        raise StapoNotRegisteredError(_not_registered_message(loss_mode))


@dataclass
class StapoPolicyLossConfig(PolicyLossConfig):
    """verl ``PolicyLossConfig`` plus the STAPO / 20-Entropy hyperparameters.

    Instantiated by Hydra (``_target_``) on the driver (``validate_config``) and in every actor worker
    (``init_model``), so ``__post_init__`` doubles as the per-process self-check.

    Attributes:
        tau_p: τ_p, absolute probability threshold; a token is a candidate iff p < tau_p (strict).
            Allowed 0 < tau_p < 1. Default 0.002 (spec §0).
        entropy_quantile: q; τ_h = torch.quantile(P, q, 'linear') over the candidate population P.
            Allowed 0 < q <= 1. Default 0.75 (spec §2.3).
        stats_source: where p and H come from. ``old_policy`` (default): the old-policy log-prob and
            entropy verl's v1 trainer already computes, reduced over the whole optimizer mini-batch
            across DP before its first forward (exact renormalisation, zero extra forwards).
            ``current_minibatch``: the paper's exact statistics: before the micro-batch loop of every optimizer
            mini-batch after the first of a step, one no-grad forward of the mini-batch with the *current*
            policy (the engine's own ``infer_batch`` with ``calculate_entropy``) gives p and H; reduced over the
            whole mini-batch across DP, exact renormalisation (the first mini-batch, where π_θ = π_old, reuses
            the old-policy values: identical). ``current_micro_batch``: current-policy values from the
            training forward, per micro-batch, candidates gathered across DP (needs
            ``actor.calculate_entropy=True``; running denominator).
        top_entropy_ratio: ρ for ``loss_mode=top_entropy`` (20-Entropy): keep the top ⌈ρ·N⌉ tokens by
            entropy. Allowed 0 < ρ <= 1. Default 0.2.
        top_entropy_normalizer: ``kept`` (official 80/20 code: token-mean over kept tokens) or
            ``all_tokens`` (the paper's formula: sum over kept tokens / all valid tokens).
        random_mask_seed: seed of ``loss_mode=stapo_random`` (mixed with the step's mini-batch content).
        dump_tokens: write the silenced tokens (and as many randomly drawn kept candidates) of every step to
            ``<dump_dir>/stapo_tokens.dp{rank}.jsonl`` (:mod:`stapo_verl.token_dump`). Needs an S2T loss mode and
            ``stats_source`` in ``old_policy``/``current_minibatch``. Default False.
        dump_dir: directory of the dump. ``""`` (default) → the directory of ``$VERL_FILE_LOGGER_PATH`` when that
            is set (the run directory of verl's file logger), else ``./stapo_tokens`` of the worker process.
        dump_max_rows_per_step: cap of dumped rows per DP rank per step (silenced rows first, then kept
            contrast rows); ≥ 1. Default 256.
    Numeric keys (every ``float``/``int`` field, inherited ones included) accept numeric strings, coerced
    exactly (``tau_p='0.002'`` → 0.002); booleans and non-numeric strings are rejected naming the key.
    Raises:
        StapoConfigError: a value of the wrong type or out of range (message names the key and what is allowed).
        StapoNotRegisteredError: ``loss_mode`` is ours but the plugin did not load in this process.
    """

    tau_p: float = 0.002
    entropy_quantile: float = 0.75
    stats_source: str = "old_policy"
    top_entropy_ratio: float = 0.2
    top_entropy_normalizer: str = "kept"
    random_mask_seed: int = 0
    dump_tokens: bool = False
    dump_dir: str = ""
    dump_max_rows_per_step: int = 256

    def _coerce_fields(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            kind, optional = _scalar_kind(hints.get(f.name))
            value = getattr(self, f.name)
            if kind is None or (optional and value is None):
                continue
            coerced = _coerce_scalar(f.name, value, kind)
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)  # BaseConfig fields are frozen after __init__

    def __post_init__(self):
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        self._coerce_fields()
        key = _KEY
        tau_p = float(self.tau_p)
        if not (0.0 < tau_p < 1.0):
            raise StapoConfigError(f"{key}.tau_p={self.tau_p!r} is out of range: allowed 0 < tau_p < 1")
        q = float(self.entropy_quantile)
        if not (0.0 < q <= 1.0):
            raise StapoConfigError(
                f"{key}.entropy_quantile={self.entropy_quantile!r} is out of range: allowed 0 < q <= 1"
            )
        if self.stats_source not in STATS_SOURCES:
            raise StapoConfigError(f"{key}.stats_source={self.stats_source!r}: allowed {list(STATS_SOURCES)}")
        rho = float(self.top_entropy_ratio)
        if not (0.0 < rho <= 1.0):
            raise StapoConfigError(
                f"{key}.top_entropy_ratio={self.top_entropy_ratio!r} is out of range: allowed 0 < ratio <= 1"
            )
        if self.top_entropy_normalizer not in TOP_ENTROPY_NORMALIZERS:
            raise StapoConfigError(
                f"{key}.top_entropy_normalizer={self.top_entropy_normalizer!r}: allowed {list(TOP_ENTROPY_NORMALIZERS)}"
            )
        if self.dump_max_rows_per_step < 1:
            raise StapoConfigError(
                f"{key}.dump_max_rows_per_step={self.dump_max_rows_per_step!r} is out of range: allowed >= 1"
            )
        if self.loss_mode not in STAPO_LOSS_MODES:
            raise StapoConfigError(
                f"{key}.loss_mode={self.loss_mode!r} with _target_=stapo_verl.config.StapoPolicyLossConfig: "
                f"allowed {list(STAPO_LOSS_MODES)} (use verl's PolicyLossConfig for other modes)"
            )
        if self.dump_tokens and (self.loss_mode == "top_entropy" or self.stats_source not in MINIBATCH_STATS_SOURCES):
            raise StapoConfigError(
                f"{key}.dump_tokens=True dumps the S2T mask computed before the micro-batch loop: it needs an S2T "
                f"loss_mode ({[m for m in STAPO_LOSS_MODES if m != 'top_entropy']}) and stats_source in "
                f"{list(MINIBATCH_STATS_SOURCES)} (got loss_mode={self.loss_mode!r}, "
                f"stats_source={self.stats_source!r})"
            )
        check_registered(self.loss_mode)
