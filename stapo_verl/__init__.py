"""stapo-verl: STAPO (Spurious-Token-Aware Policy Optimization, arXiv 2602.15620) for verl 0.9.1.

Registration happens in :mod:`stapo_verl.plugin`, which verl imports in every process through the ``verl.plugins``
entry point (``verl/__init__.py``). Importing this package imports verl first, so that the plugin is loaded
before any of our modules: otherwise ``import stapo_verl.config`` as a process's first import would start verl's
plugin loading half-way through ``stapo_verl.config`` (a circular import that verl swallows), and the loss modes
would silently be missing from that process.
"""

__version__ = "0.1.0"

#: Loss modes this plugin registers in ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``.
STAPO_LOSS_MODES = ("stapo", "stapo_high_entropy", "stapo_random", "stapo_full_mask", "top_entropy")

import verl  # noqa: E402,F401  (after the constants: the plugin imports them while verl loads it)
