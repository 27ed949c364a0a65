"""verl plugin entry point (``setup.cfg``: ``verl.plugins = stapo = stapo_verl.plugin``), imported by ``import verl`` in
every process: gates the installed verl and installs the integration (:func:`.integration.verl_0_9_1.installer.install`;
on another verl one warning line, nothing patched); with ``VERL_PLATFORM=cpu`` also the CPU platform. It runs inside
verl's own ``__init__``, so what it installs imports verl lazily. A failure is logged at ERROR (verl's loader logs a
plugin's import error at DEBUG and goes on without it).
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
