"""verl plugin entry point, imported by ``import verl`` in every process (driver, TaskRunner, Ray workers).

``setup.cfg`` declares ``[options.entry_points] verl.plugins = stapo = stapo_verl.plugin``. Importing this module
checks the installed verl against the plugin's ledger and installs the integration
(:func:`stapo_verl.integration.install`): the policy token masks, ``loss_mode=stapo``, the masked ``ppo_loss``, the
mask pre-pass in ``TrainingWorker.train_batch``, the driver-side config fill and checks, and the Hydra options.
Only when ``VERL_PLATFORM=cpu``: the CPU platform (:mod:`stapo_verl.cpu`); nothing under it is imported otherwise.

On a verl the ledger was not written for, the import logs one warning line and installs nothing (the CPU platform
included: it patches verl's private API too), so every job that does not ask for the plugin runs as without it;
see :mod:`stapo_verl.integration.verl_0_9_1` for how a job that asks for it fails.
"""

import os

from stapo_verl.integration import install as _install

if _install() and os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
    # Before verl's FSDP engine module is imported: it freezes the device name at import time.
    from stapo_verl.cpu import register as _register_cpu

    _register_cpu()
