"""stapo-verl: STAPO (Spurious-Token-Aware Policy Optimization, arXiv 2602.15620) for verl 0.9.1.

Importing this package has no side effects. Registration happens in :mod:`stapo_verl.plugin`, which
verl imports in every process through the ``verl.plugins`` entry point (``verl/__init__.py``).
"""

__version__ = "0.1.0"

#: Loss modes this plugin registers in ``verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``.
STAPO_LOSS_MODES = ("stapo", "stapo_high_entropy", "stapo_random", "stapo_full_mask", "top_entropy")
