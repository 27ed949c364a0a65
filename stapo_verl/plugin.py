"""verl plugin entry point (``setup.cfg``: ``verl.plugins = stapo = stapo_verl.plugin``), imported by ``import verl`` in
every process: the driver, the TaskRunner, every Ray worker.

It gates the installed verl against the ledger and installs the integration
(:func:`stapo_verl.integration.verl_0_9_1.installer.install`); on another verl it logs one warning line and patches
nothing. Only with ``VERL_PLATFORM=cpu``: the CPU platform (:mod:`stapo_verl.cpu`). Import order: this module runs in
the middle of verl's own ``__init__``, so what installing needs imports verl only where it is used, or from a
deferred post-import hook. A failure is logged at ERROR, because verl's loader logs a plugin's import error at DEBUG
level and goes on without it.
"""

import logging
import os

try:
    from stapo_verl.integration.verl_0_9_1.installer import install as _install

    if _install() and os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        from stapo_verl.cpu import register as _register_cpu  # before verl freezes the FSDP engine's device name

        _register_cpu()
except Exception as _e:
    _hint = (" The process imported a stapo_verl module before verl, and that module imported verl (hence this "
             "plugin) halfway through its own import; import verl first.") if "partially initialized" in str(_e) else ""
    logging.getLogger(__name__).error("stapo-verl did not load, verl runs without it: %s: %s.%s",
                                      type(_e).__name__, _e, _hint)
    raise
