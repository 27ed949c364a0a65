"""Policy-loss config with the token-mask keys, and the checks of a composed trainer config (verl 0.9.1 only).

Why this lives in the verl 0.9.1 integration and not in :mod:`stapo_verl.core`: every name here exists because verl
0.9.1's ``PolicyLossConfig`` has no ``token_mask``. The upstream series (``upstream/``) adds the field and its checks to
verl's own ``PolicyLossConfig``, so there is no ``_target_`` to fill, no plugin to require and no replaced loss mode to
refuse; with it, this module goes. Nothing here is split out into core because what is independent of the verl
version, the allowed values of every key, already lives in :mod:`stapo_verl.algo.config_ranges`, and the masks declare
which keys they read where they are registered (:mod:`stapo_verl.core.masks`).

verl 0.9.1's ``PolicyLossConfig`` has no ``token_mask``; :class:`StapoPolicyLossConfig` is that class plus the keys
the upstream series adds (``token_mask``, S2T's ``s2t_tau_p`` and ``s2t_entropy_quantile``) and the plugin's own
(statistics source, ablation and dump settings). It is selected through ``policy_loss._target_``, which the plugin
fills on the driver when ``loss_mode=stapo`` or a ``token_mask`` is set (:func:`fill_policy_loss_target`), so users
never type it. Key names and defaults::

    actor_rollout_ref.actor.policy_loss.token_mask=s2t          # or s2t_high_entropy, s2t_random, s2t_full,
                                                                 #    top_entropy; null = no mask (default)
    actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.002
    actor_rollout_ref.actor.policy_loss.s2t_entropy_quantile=0.75
    actor_rollout_ref.actor.policy_loss.stats_source=old_policy  # or current_minibatch
    actor_rollout_ref.actor.policy_loss.mask_statistics=true     # false: the mask's own metrics only

The allowed values of every key are defined once, in :mod:`stapo_verl.algo.config_ranges` (which the library
functions that take the same values call too); the keys a mask reads are checked when it is selected.

Source: STAPO paper (arXiv 2602.15620) §3 and §5 for the defaults; verl ``verl.workers.config.PolicyLossConfig``.
"""

from __future__ import annotations

import dataclasses
import logging
from types import MappingProxyType
import sys
import types
import typing
from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, open_dict, read_write
from verl.workers.config.actor import PolicyLossConfig

from stapo_verl.algo.config_ranges import (
    ACTOR,
    KEY,
    RANGES,
    StapoConfigError,
    check_collapse_warmup,
    check_current_minibatch_pipeline,
    check_range,
)
from stapo_verl.core.masks import S2T_TOKEN_MASKS
from stapo_verl.core.registry import POLICY_TOKEN_MASK_REGISTRY
from stapo_verl.integration.verl_0_9_1.job import REPLACED_LOSS_MODES, asks_for_mask

logger = logging.getLogger(__name__)

#: the ranged keys each registered mask reads (:mod:`stapo_verl.core.masks`; ``random_mask_seed`` is any int), checked
#: only when that mask is selected
MASK_KEYS = MappingProxyType({
    "s2t": ("s2t_tau_p", "s2t_entropy_quantile"),
    "s2t_high_entropy": ("s2t_tau_p", "s2t_entropy_quantile"),
    "s2t_random": ("s2t_tau_p", "s2t_entropy_quantile"),
    "s2t_full": ("s2t_tau_p",),
    "top_entropy": ("top_entropy_ratio",),
})
#: every ranged token-mask key
TOKEN_MASK_KEYS = ("s2t_tau_p", "s2t_entropy_quantile", "top_entropy_ratio")
#: where the statistics the mask reads come from
STATS_SOURCES = ("old_policy", "current_minibatch")
#: keys of earlier stapo-verl versions → their names now, prefixed with their method as verl's loss keys are
#: (``clip_cov_*``, ``kl_cov_*``, ``dro_beta``). Still declared (None), so that an old override reaches the error
#: naming the new key instead of Hydra's ``Key 'tau_p' is not in struct``.
RENAMED_KEYS = types.MappingProxyType({"tau_p": "s2t_tau_p", "entropy_quantile": "s2t_entropy_quantile"})
#: verl 0.9.1's ``actor.yaml`` default for ``policy_loss._target_``
VERL_DEFAULT_TARGET = "verl.workers.config.PolicyLossConfig"
_KEY = KEY
_ACTOR = ACTOR
#: the module whose successful import means the plugin's verl integration is installed in this process
PLUGIN_MODULE = "stapo_verl.plugin"


class StapoNotRegisteredError(RuntimeError):
    """The config asks for the plugin, but the plugin's verl integration is not loaded in this process."""


def _not_loaded_message() -> str:
    return (
        f"{_KEY} asks for stapo-verl (loss_mode=stapo or a token_mask), but the plugin is not loaded in this "
        "process. verl loads plugins through the 'verl.plugins' entry point and ignores import errors. Fix: "
        "`pip install stapo-verl` (or `pip install -e <checkout>`) in the Python environment of EVERY node; do "
        "not set VERL_USE_EXTERNAL_PLUGINS=none (or include 'stapo' in its list); run "
        "`python -c 'import stapo_verl.plugin'` to see the import error."
    )


def _check_loss_mode_registered(loss_mode: str) -> None:
    """Fail at config construction (driver and workers) on a ``loss_mode`` verl's ``POLICY_LOSS_REGISTRY`` does not
    hold, instead of after Ray, the workers, a validation and a rollout, where ``verl.trainer.ppo.core_algos.
    get_policy_loss_fn`` would raise (with the mask already applied to that mini-batch).

    Raises:
        StapoConfigError: naming the key, the value and the registered loss modes. A loss registered with verl's
            ``@register_policy_loss`` must be registered before the config is built (e.g. by a module a
            ``verl.plugins`` entry point imports, as this plugin registers ``stapo``).
    """
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    if loss_mode not in POLICY_LOSS_REGISTRY:
        raise StapoConfigError(
            f"{_KEY}.loss_mode={loss_mode!r} is not a registered policy loss: allowed {sorted(POLICY_LOSS_REGISTRY)} "
            "(a loss of your own must be registered with verl's @register_policy_loss before the config is built, "
            "e.g. in a module a 'verl.plugins' entry point imports)"
        )


def require_plugin_loaded(asked_by: str = f"{_KEY} (loss_mode=stapo or a token_mask)") -> None:
    """Raise unless ``stapo_verl.plugin`` was imported in this process and installed the verl integration.

    Checked wherever the config is built (driver and every actor worker), because a worker where the entry point
    failed, or a verl the plugin was not written for, would otherwise train without the mask.

    Args:
        asked_by: what asks for the plugin (the config key and value), named first in the version error.

    Raises:
        StapoNotRegisteredError: the plugin module was not imported (verl swallowed its import error, or plugins
            are disabled), or it did not install the integration for another reason.
        stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: the plugin stayed inactive because the installed
            verl is not the one it was written for (a ``BaseException``; the message names both versions and
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1``).
    """
    if PLUGIN_MODULE not in sys.modules:
        raise StapoNotRegisteredError(_not_loaded_message())
    from stapo_verl.integration import verl_0_9_1 as gate

    if not gate.installed():
        gate.check_verl(asked_by)
        raise StapoNotRegisteredError(_not_loaded_message())


def check_renamed_keys(values) -> None:
    """Raise on a key of :data:`RENAMED_KEYS` that has a value, naming the key it was renamed to.

    Args:
        values: the policy-loss node: a ``DictConfig``, a mapping, or a :class:`StapoPolicyLossConfig`.

    Raises:
        StapoConfigError: naming the old key, its value and the new key (``tau_p`` → ``s2t_tau_p``).
    """
    for old, new in RENAMED_KEYS.items():
        value = getattr(values, old, None) if dataclasses.is_dataclass(values) else values.get(old, None)
        if value is not None:
            raise StapoConfigError(
                f"{_KEY}.{old}={value!r}: the key was renamed to {_KEY}.{new} (a method's keys carry its prefix, as "
                f"verl's clip_cov_*/kl_cov_* do). Fix: {_KEY}.{new}={value}",
                key=f"{_KEY}.{old}", value=value, allowed=f"null; set {_KEY}.{new} instead",
            )


def plugin_request(loss_mode, token_mask) -> str | None:
    """What a policy-loss config asks of the plugin, as the errors name it (e.g.
    ``actor_rollout_ref.actor.policy_loss.loss_mode='stapo', token_mask='s2t'``); None when it asks for nothing
    (neither ``loss_mode=stapo`` nor a ``token_mask``). Raises nothing."""
    asked = [f"loss_mode={loss_mode!r}"] if loss_mode == "stapo" else []
    asked += [f"token_mask={token_mask!r}"] if token_mask is not None else []
    return f"{_KEY}.{', '.join(asked)}" if asked else None


def _coerce_scalar(name: str, value, kind: type):
    """``value`` as ``kind`` (float/int/bool/str), coercing numeric strings exactly; raise otherwise.

    A quoted Hydra value (``s2t_tau_p='0.002'``) arrives as the string "0.002"; it is parsed with Python's
    ``float``/``int``, the same literal Hydra parses unquoted. Booleans are never numbers and floats are never
    truncated to ints.

    Raises:
        StapoConfigError: naming ``actor_rollout_ref.actor.policy_loss.<name>``, the value and the allowed type.
    """

    def fail(allowed: str):
        raise StapoConfigError(f"{_KEY}.{name}={value!r} ({type(value).__name__}): allowed {allowed}",
                               key=f"{_KEY}.{name}", value=value, allowed=allowed)

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
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), 10)
        except ValueError:
            pass
    fail("an int or an integer string such as '7' (no fractional part)")


def _scalar_kind(annotation) -> tuple[type | None, bool]:
    """(float/int/bool/str or None, whether None is allowed) for a dataclass field annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and non_none[0] in (float, int, bool, str):
            return non_none[0], True
        return None, False
    return (annotation, False) if annotation in (float, int, bool, str) else (None, False)


@dataclass
class StapoPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the policy-token-mask keys (built by Hydra through ``_target_``).

    Instantiated on the driver (verl's ``validate_config``) and in every actor worker (``init_model``), so
    ``__post_init__`` doubles as the per-process check that the plugin is loaded.

    Attributes:
        token_mask: name of a registered policy token mask applied to the policy-gradient term of any
            ``loss_mode`` (``s2t``, ``s2t_high_entropy``, ``s2t_random``, ``s2t_full``, ``top_entropy``); None
            for no mask. ``loss_mode=stapo`` sets it to ``s2t`` when unset.
        s2t_tau_p: τ_p; a token is a candidate iff p < τ_p (strict). 0 < τ_p < 1; default 0.002 (paper §5).
        s2t_entropy_quantile: q; τ_h = Quantile_q(P), linear interpolation. 0 < q ≤ 1; default 0.75 (paper §3).
        stats_source: where p and H come from: ``old_policy`` (default; the old-log-prob pass of verl's v1
            trainer, no extra forward) or ``current_minibatch`` (one no-grad forward of each optimizer mini-batch
            with the current weights, the paper's Algorithm 1; +1 forward per mini-batch).
        tau_p, entropy_quantile: renamed to ``s2t_tau_p`` and ``s2t_entropy_quantile``; any value raises naming
            the new key (:data:`RENAMED_KEYS`). Default None.
        top_entropy_ratio: ρ of ``token_mask=top_entropy``: keep the ⌈ρ·N⌉ tokens of highest entropy.
            0 < ρ ≤ 1; default 0.2.
        random_mask_seed: seed of ``token_mask=s2t_random`` (mixed with the global step and mini-batch index).
        mask_statistics: log the mask statistics of every optimizer mini-batch (``actor/stapo/candidate_entropy_*``,
            ``pos_adv_below_tau_p_frac``, ``silenced_share_*``, ``silenced_grad_share*``; the p and H histograms;
            and with ``stats_source=current_minibatch`` the disagreement with the old policy's mask); S2T-family
            masks only. Two tensor ``all_gather`` calls over the DP group per mini-batch, after the update. False:
            the mask does its own work only. Default True.
        dump_tokens: write the silenced tokens and as many kept candidates per step as JSONL
            (:mod:`stapo_verl.minibatch.token_dump`); S2T-family masks only.
        dump_dir: directory of the dump; ``""`` → the directory of ``$VERL_FILE_LOGGER_PATH`` when set, else
            ``./stapo_tokens``.
        dump_max_rows_per_step: cap of dumped rows per DP rank per step (≥ 1). Default 256.
        dump_every: when the dumped rows are also logged as a table to verl's trackers (``trainer.logger``):
            None (default) at each validation step (``trainer.test_freq`` and the last step), 0 never, n ≥ 1 every
            n steps and at the last step. Needs ``dump_tokens``; see ``docs/diagnostics.md``.
        table_max_rows: rows of one tracker table, over the DP group: silenced first (up to half), then as many kept
            candidates (≥ 2). Default 256.
        collapse_z_threshold: |z| of ``actor/entropy`` or of the LM-head (or total) gradient norm against its
            running mean (on the log scale) above which a one-line console warning is printed (> 0); None: z-scores
            only. Default 5 (calibrated: ``docs/diagnostics.md``, "Calibration").
        collapse_window: previous steps the running mean and standard deviation use (≥ 2). Default 20.
        collapse_warmup_steps: previous steps needed before a z-score is logged (2 ≤ it ≤ collapse_window).
            Default 10.

    Numeric keys (inherited ones included) accept numeric strings, coerced exactly. Every range above is defined
    once, in :mod:`stapo_verl.algo.config_ranges`; the token-mask keys (``s2t_tau_p``, ``s2t_entropy_quantile``,
    ``top_entropy_ratio``) are all checked whenever a token mask is selected.

    Raises:
        StapoConfigError: a value of the wrong type or out of range, an unknown ``token_mask``, a removed loss
            mode, statistics source or key name (:data:`RENAMED_KEYS`), or ``loss_mode=stapo`` with a non-S2T mask.
        StapoNotRegisteredError: a mask or ``loss_mode=stapo`` is configured but the plugin is not loaded here.
        stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: a mask or ``loss_mode=stapo`` is configured on a
            verl the plugin was not written for (checked first; see :func:`require_plugin_loaded`).
    """

    token_mask: Optional[str] = None
    s2t_tau_p: float = 0.002
    s2t_entropy_quantile: float = 0.75
    tau_p: Optional[float] = None
    entropy_quantile: Optional[float] = None
    stats_source: str = "old_policy"
    top_entropy_ratio: float = 0.2
    random_mask_seed: int = 0
    mask_statistics: bool = True
    dump_tokens: bool = False
    dump_dir: str = ""
    dump_max_rows_per_step: int = 256
    dump_every: Optional[int] = None
    table_max_rows: int = 256
    collapse_z_threshold: Optional[float] = 5.0
    collapse_window: int = 20
    collapse_warmup_steps: int = 10

    def _coerce_fields(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            kind, optional = _scalar_kind(hints.get(f.name))
            value = getattr(self, f.name)
            if kind is None or (optional and value is None):
                continue
            coerced = _coerce_scalar(f.name, value, kind)
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)  # verl's BaseConfig freezes fields after __init__

    def __post_init__(self):
        asked = plugin_request(self.loss_mode, self.token_mask)
        if asked:
            # First, before verl's own checks: on a verl the plugin was not written for this is the error to see.
            require_plugin_loaded(asked)
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()
        self._coerce_fields()
        check_renamed_keys(self)
        if self.loss_mode in REPLACED_LOSS_MODES:
            raise StapoConfigError(
                f"{_KEY}.loss_mode={self.loss_mode!r} was replaced by a token mask that works with any loss: use "
                f"{_KEY}.loss_mode=vanilla {_KEY}.token_mask={REPLACED_LOSS_MODES[self.loss_mode]}"
            )
        if self.loss_mode == "stapo":
            if self.token_mask is None:
                object.__setattr__(self, "token_mask", "s2t")
            elif self.token_mask not in S2T_TOKEN_MASKS:
                raise StapoConfigError(
                    f"{_KEY}.loss_mode=stapo is verl's vanilla loss with an S2T mask; {_KEY}.token_mask="
                    f"{self.token_mask!r} is not one (allowed {list(S2T_TOKEN_MASKS)}); to put a registered mask "
                    f"in front of verl's vanilla loss use loss_mode=vanilla token_mask=<mask> (masks: "
                    f"{sorted(POLICY_TOKEN_MASK_REGISTRY)})"
                )
        if self.token_mask is None:
            return
        _check_loss_mode_registered(self.loss_mode)
        if self.token_mask not in POLICY_TOKEN_MASK_REGISTRY:
            raise StapoConfigError(
                f"{_KEY}.token_mask={self.token_mask!r}: allowed {sorted(POLICY_TOKEN_MASK_REGISTRY)} or null"
            )
        if self.stats_source == "current_micro_batch":
            raise StapoConfigError(
                f"{_KEY}.stats_source='current_micro_batch' was removed: it could not renormalise exactly (later "
                "micro-batches' masks are unknown when a micro-batch's loss is computed). Use "
                "stats_source=current_minibatch (the paper's current-policy statistics, exact) or old_policy"
            )
        if self.stats_source not in STATS_SOURCES:
            raise StapoConfigError(f"{_KEY}.stats_source={self.stats_source!r}: allowed {list(STATS_SOURCES)}",
                                   key=f"{_KEY}.stats_source", value=self.stats_source,
                                   allowed=" or ".join(STATS_SOURCES))
        self._check_mask_keys()
        if self.dump_tokens:
            if self.token_mask not in S2T_TOKEN_MASKS:
                raise StapoConfigError(
                    f"{_KEY}.dump_tokens=True dumps S2T candidates: it needs token_mask in {list(S2T_TOKEN_MASKS)} "
                    f"(got {self.token_mask!r}). For this mask set {_KEY}.dump_tokens=False"
                )
            check_range("dump_max_rows_per_step", self.dump_max_rows_per_step)
        self._check_diagnostics()

    def _check_mask_keys(self) -> None:
        """The keys the selected mask reads (:data:`MASK_KEYS`), each in its range
        (:data:`stapo_verl.algo.config_ranges.RANGES`), as verl's ``PolicyLossConfig`` checks ``dro_beta`` only for
        ``loss_mode=dro``."""
        for key in MASK_KEYS.get(self.token_mask, ()):
            check_range(key, getattr(self, key))

    def _check_diagnostics(self) -> None:
        """Ranges of the tracker-diagnostics keys (``dump_every``, ``table_max_rows``, ``collapse_*``)."""
        check_range("dump_every", self.dump_every)
        if self.dump_every is not None and self.dump_every > 0 and not self.dump_tokens:
            raise StapoConfigError(
                f"{_KEY}.dump_every={self.dump_every} logs the token dump's rows to the trackers: it needs "
                f"{_KEY}.dump_tokens=True"
            )
        check_range("table_max_rows", self.table_max_rows)
        check_range("collapse_z_threshold", self.collapse_z_threshold)
        check_range("collapse_window", self.collapse_window)
        check_collapse_warmup(self.collapse_warmup_steps, self.collapse_window)


def stapo_target() -> str:
    """The ``_target_`` that builds :class:`StapoPolicyLossConfig`."""
    return f"{StapoPolicyLossConfig.__module__}.{StapoPolicyLossConfig.__qualname__}"


def _node(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return None
        try:
            node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
        except Exception:  # omegaconf struct errors on missing keys
            return None
    return node


def _get(cfg, dotted: str, default=None):
    value = _node(cfg, dotted)
    return default if value is None else value


def _is_stapo_config_class(target) -> bool:
    """True if ``target`` imports as :class:`StapoPolicyLossConfig` or a subclass."""
    from hydra.utils import get_class

    try:
        cls = get_class(str(target))
    except Exception:  # not importable: the callers' errors name the value
        return False
    return isinstance(cls, type) and issubclass(cls, StapoPolicyLossConfig)


def _resolve(target):
    """The class ``target`` names (``hydra.utils.get_class``).

    Raises:
        StapoConfigError: ``target`` cannot be imported (the message names the value).
    """
    from hydra.utils import get_class

    try:
        return get_class(str(target))
    except Exception as e:  # ImportError, AttributeError, hydra's ValueError all mean "not a usable class"
        raise StapoConfigError(f"{_KEY}._target_={target!r} cannot be imported: {type(e).__name__}: {e}") from e


def fill_policy_loss_target(config) -> bool:
    """Point ``policy_loss._target_`` at :class:`StapoPolicyLossConfig` when the run asks for the plugin.

    verl's ``actor.yaml`` says ``_target_: verl.workers.config.PolicyLossConfig``, which has no ``token_mask``.
    When ``loss_mode=stapo`` or a ``token_mask`` is set and the target is still verl's, this rewrites that one
    value in place, so every later ``omega_conf_to_dataclass`` (driver and workers) builds our class. A target the
    user chose is left alone if it is our class or a subclass. Hydra cannot do this at composition time: a config
    value cannot choose a defaults-list entry.

    Args:
        config: the full trainer config (OmegaConf ``DictConfig`` of ``ppo_trainer``); modified in place.

    Returns:
        True if ``_target_`` was written.

    Raises:
        StapoConfigError: the run asks for the plugin but ``_target_`` names another class.
    """
    pl = _node(config, _KEY)
    if not isinstance(pl, DictConfig) or not asks_for_mask(pl):
        return False
    target = pl.get("_target_", None)
    if target == stapo_target() or _is_stapo_config_class(target):
        return False
    if target is not None and target != VERL_DEFAULT_TARGET and _resolve(target) is not PolicyLossConfig:
        raise StapoConfigError(
            f"{_KEY}.loss_mode={pl.get('loss_mode')}/token_mask={pl.get('token_mask', None)} needs "
            f"{_KEY}._target_={stapo_target()} (or a subclass), got {target!r}. Remove the _target_ override "
            "(the plugin sets it) or point it at that class."
        )
    with read_write(pl), open_dict(pl):
        pl["_target_"] = stapo_target()
    logger.info("%s: set _target_=%s", _KEY, stapo_target())
    return True


def validate_token_mask_config(config) -> None:
    """Cross-key checks of a composed trainer config that uses a token mask or ``loss_mode=stapo``.

    Args:
        config: the full trainer config (OmegaConf ``DictConfig``), after :func:`fill_policy_loss_target`.

    Raises:
        StapoConfigError: a renamed key has a value (:data:`RENAMED_KEYS`); ``_target_`` is not our config
            class; the mask's statistics need verl's v1 old-log-prob
            pass (``trainer.use_v1=True``, ``algorithm.rollout_correction.bypass_mode=False``);
            ``stats_source=current_minibatch`` with Megatron pipeline parallelism; distillation is enabled.
        StapoNotRegisteredError: the plugin is not loaded in this process.
    """
    pl = _node(config, _KEY)
    if pl is None or not asks_for_mask(pl):
        return
    require_plugin_loaded()
    check_renamed_keys(pl)
    target = _get(pl, "_target_", "")
    if target != stapo_target() and not _is_stapo_config_class(target):
        raise StapoConfigError(
            f"{_KEY}: loss_mode={_get(pl, 'loss_mode')}, token_mask={_get(pl, 'token_mask')} need "
            f"{_KEY}._target_={stapo_target()} (got {target!r})"
        )
    stats_source = _get(pl, "stats_source", "old_policy")
    if not bool(_get(config, "trainer.use_v1", True)):
        raise StapoConfigError(
            "the token mask reads the old-log-prob pass (old_log_probs, entropy) of verl's v1 trainer: set "
            "trainer.use_v1=True"
        )
    if bool(_get(config, "algorithm.rollout_correction.bypass_mode", False)):
        raise StapoConfigError(
            "the token mask needs verl's old-log-prob pass (old_log_probs and entropy), which "
            "algorithm.rollout_correction.bypass_mode=True skips: set it to False"
        )
    if stats_source == "current_minibatch" and _get(config, f"{_ACTOR}.strategy", "") == "megatron":
        check_current_minibatch_pipeline(int(_get(config, f"{_ACTOR}.megatron.pipeline_model_parallel_size", 1) or 1))
    if bool(_get(config, f"{_ACTOR}.calculate_entropy", False)):
        logger.warning(
            "%s.calculate_entropy=True is not needed by the token mask (it reads the old-log-prob pass's entropy); "
            "it makes verl compute a gradient-carrying entropy in every training forward. Set it to False.",
            _ACTOR,
        )
    if _get(config, "distillation.enabled", False):
        raise StapoConfigError(
            f"{_KEY}.token_mask is not supported with distillation.enabled=True: verl's distillation loss "
            "(verl.trainer.distillation.losses) builds its policy-gradient term without the mask"
        )
    if float(_get(config, f"{_ACTOR}.entropy_coeff", 0.0) or 0.0) != 0.0:
        logger.warning("STAPO is defined without an entropy bonus; %s.entropy_coeff is non-zero.", _ACTOR)
