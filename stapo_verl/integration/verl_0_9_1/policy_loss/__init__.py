"""What exists only because verl 0.9.1's ``PolicyLossConfig`` has no ``token_mask`` (imports verl first).

* :mod:`.config` — :class:`~.config.StapoPolicyLossConfig` (verl's ``PolicyLossConfig`` plus the mask keys), the
  ``policy_loss._target_`` fill on the driver, the check that the plugin is loaded, and the cross-key checks of a
  composed trainer config;
* :mod:`.hydra_options` — the Hydra options ``actor/stapo_{dp,megatron}_actor`` that declare those keys (no ``+``).

The upstream series (``upstream/``) adds ``token_mask`` and the S2T keys to verl's own ``PolicyLossConfig`` and
``actor.yaml``; with it, this package goes. It is part of the verl 0.9.1 integration, not of :mod:`stapo_verl.core`,
which holds only what the series copies into verl.
"""

# verl first, as in stapo_verl.core: ``import verl`` loads this plugin through its entry point, and the plugin's
# install() imports both modules of this package. A process whose first import is one of them would otherwise start
# verl's plugin loading inside that half-initialised module, where verl swallows the resulting import error and the
# plugin silently does not load. Here only this package's __init__ is unfinished, and it defines nothing install()
# needs.
import verl  # noqa: F401
