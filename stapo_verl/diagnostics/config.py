"""The diagnostics' policy-loss keys: their types and ranges, checked when a job asks for the diagnostics
(``mask_statistics`` or ``dump_tokens``; :class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.
StapoPolicyLossConfig`) and by the library functions taking one of their values. Pure."""

from __future__ import annotations

import math
import types

from stapo_verl.algo.config_ranges import KEY, Range, StapoConfigError, check_range, check_type

#: ``actor_rollout_ref.actor.policy_loss.<key>`` → its allowed values (as :data:`stapo_verl.algo.config_ranges.RANGES`)
DIAGNOSTICS_RANGES = types.MappingProxyType({
    "dump_max_rows_per_step": Range(lambda v: v >= 1, ">= 1"),
    "dump_every": Range(lambda v: v is None or v >= 0,
                        "null (at each validation), 0 (never) or n >= 1 (every n steps)"),
    "table_max_rows": Range(lambda v: v >= 2, ">= 2"),
    "collapse_z_threshold": Range(lambda v: v is None or (math.isfinite(v) and v > 0),
                                  "> 0, or null for z-scores without warnings"),
    "collapse_window": Range(lambda v: v >= 2, ">= 2"),
})
#: the type each diagnostics key takes (as :data:`stapo_verl.algo.config_ranges.TYPES`)
DIAGNOSTICS_TYPES = types.MappingProxyType({
    "dump_dir": ((str,), "a string"),
    "dump_max_rows_per_step": ((int,), "an int"),
    "dump_every": ((int, type(None)), "an int or null"),
    "table_max_rows": ((int,), "an int"),
    "collapse_z_threshold": ((int, float, type(None)), "a number or null"),
    "collapse_window": ((int,), "an int"),
    "collapse_warmup_steps": ((int,), "an int"),
})


def check_collapse_warmup(warmup: int, window: int) -> int:
    """``warmup`` if 2 ≤ ``collapse_warmup_steps`` ≤ ``collapse_window`` (the z-score needs two previous values).

    Raises:
        StapoConfigError: naming ``collapse_warmup_steps``, its value and the window.
    """
    if not 2 <= warmup <= window:
        raise StapoConfigError(f"{KEY}.collapse_warmup_steps={warmup!r} is out of range: allowed "
                               f"2 <= collapse_warmup_steps <= collapse_window ({window!r})")
    return warmup


def check_diagnostics_keys(pl) -> None:
    """Types and ranges of the diagnostics keys of a policy-loss config ``pl`` (any object with the attributes).

    Raises:
        StapoConfigError: a value of the wrong type or range, or ``dump_every`` > 0 without the dump; naming the
            key and the fix.
    """
    for key in DIAGNOSTICS_TYPES:
        check_type(key, getattr(pl, key), DIAGNOSTICS_TYPES)
    if pl.dump_tokens:
        check_range("dump_max_rows_per_step", pl.dump_max_rows_per_step, DIAGNOSTICS_RANGES)
    check_range("dump_every", pl.dump_every, DIAGNOSTICS_RANGES)
    if pl.dump_every is not None and pl.dump_every > 0 and not pl.dump_tokens:
        raise StapoConfigError(f"{KEY}.dump_every={pl.dump_every} logs the token dump's rows to the trackers: it "
                               f"needs {KEY}.dump_tokens=True")
    for key in ("table_max_rows", "collapse_z_threshold", "collapse_window"):
        check_range(key, getattr(pl, key), DIAGNOSTICS_RANGES)
    check_collapse_warmup(pl.collapse_warmup_steps, pl.collapse_window)
