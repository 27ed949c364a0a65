"""verl 0.9.1's ``PolicyLossConfig`` plus the token-mask keys (the upstream series adds them to verl's own class, and
this module goes), selected through ``policy_loss._target_`` (filled on the driver: :mod:`.checks`) or the Hydra
options ``actor/stapo_<engine>_actor``. Allowed values: :mod:`stapo_verl.algo.config_ranges`.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from verl.workers.config.actor import PolicyLossConfig

from stapo_verl.algo.config_ranges import KEY, StapoConfigError, check_range, check_type
from stapo_verl.core.masks import LAB_MASK_MODULE, LAB_MASKS, S2T_TOKEN_MASKS
from stapo_verl.core.registry import POLICY_TOKEN_MASK_REGISTRY
from stapo_verl.integration.verl_0_9_1.job import REPLACED_LOSS_MODES, asks_for_diagnostics, asks_for_mask

#: the ranged keys each registered mask reads, checked only when that mask is selected
MASK_KEYS = MappingProxyType({"s2t": ("s2t_tau_p", "s2t_entropy_quantile"),
                              "s2t_high_entropy": ("s2t_tau_p", "s2t_entropy_quantile"),
                              "s2t_random": ("s2t_tau_p", "s2t_entropy_quantile"),
                              "s2t_full": ("s2t_tau_p",), "top_entropy": ("top_entropy_ratio",)})
TOKEN_MASK_KEYS = ("s2t_tau_p", "s2t_entropy_quantile", "top_entropy_ratio")
STATS_SOURCES = ("old_policy", "current_minibatch")
PLUGIN_MODULE = "stapo_verl.plugin"


class StapoNotRegisteredError(RuntimeError):
    """The config asks for the plugin, but the plugin's verl integration is not loaded in this process."""


def require_plugin_loaded(asked_by: str = f"{KEY} (loss_mode=stapo or a token_mask)") -> None:
    """Raise unless ``stapo_verl.plugin`` installed the verl integration in this process (checked wherever the config
    is built, so that no process trains without the mask).

    Raises:
        stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: the installed verl is not the plugin's.
        StapoNotRegisteredError: the plugin was not imported (verl ignores a plugin's import error) or not installed.
    """
    from stapo_verl.integration import verl_0_9_1 as gate

    if PLUGIN_MODULE not in sys.modules or not gate.installed():
        if PLUGIN_MODULE in sys.modules:
            from stapo_verl.integration.verl_0_9_1.unsupported import check_verl

            check_verl(asked_by)
        raise StapoNotRegisteredError(
            f"{asked_by} asks for stapo-verl, but the plugin is not loaded in this process (verl ignores a plugin's "
            "import error). Fix: `pip install stapo-verl` in the environment of every node, keep "
            "VERL_USE_EXTERNAL_PLUGINS unset (or include 'stapo'), and run `python -c 'import stapo_verl.plugin'` to "
            "see the error")


def plugin_request(loss_mode, token_mask) -> str | None:
    """What a policy-loss config asks of the plugin, as errors name it; None for nothing. Raises nothing."""
    asked = ([f"loss_mode={loss_mode!r}"] if loss_mode == "stapo" else []) + (
        [f"token_mask={token_mask!r}"] if token_mask is not None else [])
    return f"{KEY}.{', '.join(asked)}" if asked else None


@dataclass
class StapoPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the policy-token-mask keys; built on the driver and in every actor worker.

    Attributes:
        token_mask: a registered policy token mask for the policy-gradient term of any ``loss_mode``, or None;
            ``loss_mode=stapo`` is ``vanilla`` with an S2T mask (``s2t`` by default).
        s2t_tau_p: τ_p, a candidate has p < τ_p; 0 < τ_p < 1, default 0.002 (paper §5).
        s2t_entropy_quantile: q, τ_h = Quantile_q of the candidates' entropy; 0 < q ≤ 1, default 0.75 (paper §3).
        stats_source: ``old_policy`` (verl's old-log-prob pass) or ``current_minibatch`` (one no-grad forward per
            optimizer mini-batch, the paper's Algorithm 1).
        top_entropy_ratio: ρ of ``top_entropy``; 0 < ρ ≤ 1. random_mask_seed: seed of ``s2t_random``.
        mask_statistics, dump_tokens: the diagnostics, off by default (docs/diagnostics.md); dump_dir,
            dump_max_rows_per_step, dump_every, table_max_rows, collapse_*: their settings, checked when asked.

    Raises:
        StapoConfigError: a value of the wrong type or range, an unknown mask, a replaced loss mode, or
            ``loss_mode=stapo`` with a non-S2T mask; the message names the key and what is allowed.
        StapoNotRegisteredError, IncompatibleVerlError: see :func:`require_plugin_loaded` (checked first).
    """

    token_mask: Optional[str] = None
    s2t_tau_p: float = 0.002
    s2t_entropy_quantile: float = 0.75
    stats_source: str = "old_policy"
    top_entropy_ratio: float = 0.2
    random_mask_seed: int = 0
    mask_statistics: bool = False
    dump_tokens: bool = False
    dump_dir: str = ""
    dump_max_rows_per_step: int = 256
    dump_every: Optional[int] = None
    table_max_rows: int = 256
    collapse_z_threshold: Optional[float] = 5.0
    collapse_window: int = 20
    collapse_warmup_steps: int = 10

    def __post_init__(self):
        asked = plugin_request(self.loss_mode, self.token_mask)
        if asked:  # first: on a verl the plugin was not written for this is the error to see
            require_plugin_loaded(asked)
        getattr(super(), "__post_init__", lambda: None)()  # verl 0.9.1's has none; a later one may
        for name in ("token_mask", "s2t_tau_p", "s2t_entropy_quantile", "stats_source", "top_entropy_ratio",
                     "random_mask_seed", "mask_statistics", "dump_tokens"):
            check_type(name, getattr(self, name))
        if self.loss_mode in REPLACED_LOSS_MODES:
            raise StapoConfigError(f"{KEY}.loss_mode={self.loss_mode!r} was replaced by a token mask: use "
                                   f"{KEY}.loss_mode=vanilla {KEY}.token_mask={REPLACED_LOSS_MODES[self.loss_mode]}")
        if self.loss_mode == "stapo" and self.token_mask is None:
            object.__setattr__(self, "token_mask", "s2t")  # verl's BaseConfig freezes fields after __init__
        if self.loss_mode == "stapo" and self.token_mask not in S2T_TOKEN_MASKS:
            raise StapoConfigError(f"{KEY}.loss_mode=stapo is vanilla with an S2T mask; token_mask="
                                   f"{self.token_mask!r} is not one (allowed {list(S2T_TOKEN_MASKS)}); for another "
                                   "mask use loss_mode=vanilla token_mask=<mask>")
        if self.token_mask is None:
            return
        if self.token_mask in LAB_MASKS:
            importlib.import_module(LAB_MASK_MODULE)  # registers the lab's masks in this process
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

        for key, value, allowed in (("loss_mode", self.loss_mode, POLICY_LOSS_REGISTRY),
                                    ("token_mask", self.token_mask, {*POLICY_TOKEN_MASK_REGISTRY, *LAB_MASKS}),
                                    ("stats_source", self.stats_source, STATS_SOURCES)):
            if value not in allowed:
                raise StapoConfigError(f"{KEY}.{key}={value!r}: allowed {sorted(allowed)} (a loss or mask of your "
                                       "own must be registered before the config is built)", key=f"{KEY}.{key}",
                                       value=value, allowed=str(sorted(allowed)))
        for key in MASK_KEYS.get(self.token_mask, ()):
            check_range(key, getattr(self, key))
        if self.dump_tokens and self.token_mask not in S2T_TOKEN_MASKS:
            raise StapoConfigError(f"{KEY}.dump_tokens=True dumps S2T candidates: it needs token_mask in "
                                   f"{list(S2T_TOKEN_MASKS)} (got {self.token_mask!r}). Fix: {KEY}.dump_tokens=False")
        if asks_for_diagnostics(self):
            from stapo_verl.diagnostics.config import check_diagnostics_keys

            check_diagnostics_keys(self)


def stapo_target() -> str:
    """The ``_target_`` that builds :class:`StapoPolicyLossConfig`."""
    return f"{StapoPolicyLossConfig.__module__}.{StapoPolicyLossConfig.__qualname__}"
