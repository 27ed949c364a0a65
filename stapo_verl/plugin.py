"""verl plugin entry point: imported by ``import verl`` in every process (driver, TaskRunner, Ray workers).

``setup.cfg`` declares ``[options.entry_points] verl.plugins = stapo = stapo_verl.plugin``; verl 0.9.1 loads
it in ``verl/__init__.py`` (and swallows import errors at DEBUG level, which is why
:class:`stapo_verl.config.StapoPolicyLossConfig` re-checks the registry and raises a clear error).

What loading does:
  * registers the STAPO policy losses (:mod:`stapo_verl.losses`);
  * installs the worker-side S2T hook and the entropy plumbing (:mod:`stapo_verl.worker_hooks`);
  * wraps ``verl.utils.config.validate_config`` with the cross-key checks of :mod:`stapo_verl.selfcheck`;
  * only when ``VERL_PLATFORM=cpu``: loads the CPU backend (:mod:`stapo_verl.cpu`). Nothing under
    ``stapo_verl.cpu`` is imported on a GPU run.
"""

import os

if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
    # Must run before verl's FSDP engine module is imported: it freezes the device name at import time.
    from stapo_verl.cpu import register as _register_cpu

    _register_cpu()

from stapo_verl import losses as _losses  # noqa: E402,F401  (registers the loss modes)
from stapo_verl import selfcheck as _selfcheck  # noqa: E402
from stapo_verl import worker_hooks as _worker_hooks  # noqa: E402

_selfcheck.install_validate_config_hook()
_worker_hooks.install()
