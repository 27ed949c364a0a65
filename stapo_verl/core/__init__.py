"""The plugin core: what runs inside verl processes (imports verl and torch only).

* :mod:`.registry` — the policy-token-mask registry (the extension point the upstream series adds to verl);
* :mod:`.losses` — the mask pre-pass and ``ppo_loss`` with the mask on the policy-gradient term;
* :mod:`.masks` — the registered masks (S2T, its ablations, 20-Entropy) and ``loss_mode=stapo``;
* :mod:`.config` — the policy-loss config with the mask keys, and the checks of a composed trainer config;
* :mod:`.hydra_options` — Hydra options that declare the keys (no ``+``).

Nothing here touches verl's private API; :mod:`stapo_verl.integration` does, in one place.
"""

# verl first: ``import verl`` loads this plugin through its entry point, which imports this package. A process whose
# first import is a core module would otherwise start verl's plugin loading inside a half-initialised module, where
# verl swallows the resulting import error and the plugin silently does not load.
import verl  # noqa: F401
