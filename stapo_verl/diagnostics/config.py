"""The checks of the diagnostics' policy-loss keys, run when a job asks for the diagnostics (``mask_statistics`` or
``dump_tokens``; :class:`stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig`). Pure: the
ranges are :mod:`stapo_verl.algo.config_ranges`'."""

from __future__ import annotations

from stapo_verl.algo.config_ranges import KEY, StapoConfigError, check_range, check_type
from stapo_verl.diagnostics.collapse import check_collapse_warmup


def check_diagnostics_keys(pl) -> None:
    """Types and ranges of the diagnostics keys of a policy-loss config ``pl`` (any object with the attributes).

    Raises:
        StapoConfigError: a value of the wrong type or range, or ``dump_every`` > 0 without the dump; naming the
            key and the fix.
    """
    for key in ("dump_dir", "dump_max_rows_per_step", "dump_every", "table_max_rows", "collapse_z_threshold",
                "collapse_window", "collapse_warmup_steps"):
        check_type(key, getattr(pl, key))
    if pl.dump_tokens:
        check_range("dump_max_rows_per_step", pl.dump_max_rows_per_step)
    check_range("dump_every", pl.dump_every)
    if pl.dump_every is not None and pl.dump_every > 0 and not pl.dump_tokens:
        raise StapoConfigError(f"{KEY}.dump_every={pl.dump_every} logs the token dump's rows to the trackers: it "
                               f"needs {KEY}.dump_tokens=True")
    check_range("table_max_rows", pl.table_max_rows)
    check_range("collapse_z_threshold", pl.collapse_z_threshold)
    check_range("collapse_window", pl.collapse_window)
    check_collapse_warmup(pl.collapse_warmup_steps, pl.collapse_window)
