"""What exists only because verl 0.9.1's ``PolicyLossConfig`` has no ``token_mask``: the config class (:mod:`.config`),
the driver's ``_target_`` fill and cross-key checks (:mod:`.checks`), the Hydra options (:mod:`.hydra_options`).
The upstream series declares the keys in verl's own ``PolicyLossConfig`` and ``actor.yaml``; with it, this goes.
"""

# verl first, as in stapo_verl.core (the plugin's install() imports this package's modules).
import verl  # noqa: F401
