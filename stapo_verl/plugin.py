"""verl plugin entry point: imported by ``import verl`` in every process (driver, TaskRunner, Ray workers).

``setup.cfg`` declares ``[options.entry_points] verl.plugins = stapo = stapo_verl.plugin``; verl 0.9.1 loads
it in ``verl/__init__.py`` (and swallows import errors at DEBUG level, which is why
:class:`stapo_verl.config.StapoPolicyLossConfig` re-checks the registry and raises a clear error).

What loading does:
  * registers the STAPO policy losses (:mod:`stapo_verl.losses`);
  * installs the worker-side S2T hook and the entropy plumbing (:mod:`stapo_verl.worker_hooks`);
  * wraps ``verl.utils.config.validate_config`` with the cross-key checks of :mod:`stapo_verl.selfcheck`;
  * wraps it again, outermost, and ``verl.trainer.main_ppo.run_ppo`` so that ``loss_mode=stapo`` alone fills
    ``policy_loss._target_`` before those checks and before Ray ships the config (:mod:`stapo_verl.loss_target`);
  * registers the Hydra options ``actor/stapo_dp_actor`` and ``actor/stapo_megatron_actor``, which declare the
    STAPO keys so they need no ``+`` (:mod:`stapo_verl.hydra_options`);
  * only when ``VERL_PLATFORM=cpu``: loads the CPU backend (:mod:`stapo_verl.cpu`). Nothing under
    ``stapo_verl.cpu`` is imported on a GPU run.
"""

import os

if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
    # Must run before verl's FSDP engine module is imported: it freezes the device name at import time.
    from stapo_verl.cpu import register as _register_cpu

    _register_cpu()

from stapo_verl import hydra_options as _hydra_options  # noqa: E402
from stapo_verl import loss_target as _loss_target  # noqa: E402
from stapo_verl import losses as _losses  # noqa: E402,F401  (registers the loss modes)
from stapo_verl import selfcheck as _selfcheck  # noqa: E402
from stapo_verl import worker_hooks as _worker_hooks  # noqa: E402

_selfcheck.install_validate_config_hook()
_loss_target.install()  # after selfcheck's hook: the fill is the outer wrapper, so it runs before the checks
_hydra_options.register()
_worker_hooks.install()
