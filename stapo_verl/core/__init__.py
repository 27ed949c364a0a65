"""The plugin core: what the upstream series copies into verl, and what it runs on (imports verl and torch only).

* :mod:`.registry` — the policy-token-mask registry (the extension point the upstream series adds to verl);
* :mod:`.losses` — the mask pre-pass and ``ppo_loss`` with the mask on the policy-gradient term;
* :mod:`.masks` — the registered masks (S2T, its ablations, 20-Entropy) and ``loss_mode=stapo``;
* :mod:`.seeding` — the per-request rollout seed (a pure function of what the request is for).

Nothing here touches verl's private API, and nothing here imports :mod:`stapo_verl.integration` (checked by
``tests/unit/core/test_layering.py``). What exists only because verl 0.9.1 lacks the extension point (the policy-loss
config class with the mask keys, the ``_target_`` fill, the Hydra options, the check that the plugin is loaded) lives
in :mod:`stapo_verl.integration.verl_0_9_1.policy_loss`; the patches of verl's private API in
:mod:`stapo_verl.integration`.
"""

# verl first: ``import verl`` loads this plugin through its entry point, which imports this package. A process whose
# first import is a core module would otherwise start verl's plugin loading inside a half-initialised module, where
# verl swallows the resulting import error and the plugin silently does not load.
import verl  # noqa: F401
