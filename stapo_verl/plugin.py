"""verl plugin entry point, imported by ``import verl`` in every process (driver, TaskRunner, Ray workers).

``setup.cfg`` declares ``[options.entry_points] verl.plugins = stapo = stapo_verl.plugin``. Importing this module
checks the installed verl against the plugin's ledger and installs the integration
(:func:`stapo_verl.integration.install`): the policy token masks, ``loss_mode=stapo``, the masked ``ppo_loss``, the
mask pre-pass in ``TrainingWorker.train_batch``, the driver-side config fill and checks, and the Hydra options.
Only when ``VERL_PLATFORM=cpu``: the CPU platform (:mod:`stapo_verl.cpu`); nothing under it is imported otherwise.

On a verl the ledger was not written for, the import logs one warning line and installs nothing (the CPU platform
included: it patches verl's private API too), so every job that does not ask for the plugin runs as without it;
see :mod:`stapo_verl.integration.verl_0_9_1` for how a job that asks for it fails.

Import order: ``import verl`` imports this module in the middle of verl's own ``__init__``. A stapo_verl module that
imports verl at its top and that installing the plugin needs would be half-initialised at that point, so the modules
that import verl live in packages that import verl first (:mod:`stapo_verl.core`), import it where they use it
(``integration/verl_0_9_1/driver_config.py``), or are imported by a deferred post-import hook; the pure modules
(:mod:`stapo_verl.algo`, :mod:`stapo_verl.diagnostics`) import neither verl nor :mod:`stapo_verl.core`. A failure is
logged at ERROR here, because verl's loader would hide it.
"""

import logging
import os

try:
    from stapo_verl.integration import install as _install

    if _install() and os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        # Before verl's FSDP engine module is imported: it freezes the device name at import time.
        from stapo_verl.cpu import register as _register_cpu

        _register_cpu()
except Exception as _e:
    # verl's plugin loader (the ``verl.plugins`` loop in ``verl/__init__.py``) logs a plugin that fails to import at
    # DEBUG level and goes on, so the job would run without the plugin and fail later on an unknown loss mode or
    # config key. Say it here, then fail the import as before.
    _hint = ""
    if "partially initialized" in str(_e):
        _hint = (" The process imported a stapo_verl module before verl, and that module imported verl (hence this "
                 "plugin) halfway through its own import; import verl first.")
    logging.getLogger(__name__).error("stapo-verl did not load, verl runs without it: %s: %s.%s",
                                      type(_e).__name__, _e, _hint)
    raise
