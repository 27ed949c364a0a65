"""What the upstream series copies into verl (:mod:`.registry`, :mod:`.losses`, :mod:`.engine_workers`,
:mod:`.masks`); imports verl and torch only, never :mod:`stapo_verl.integration` (``tests/unit/core/test_layering.py``).
:mod:`.seeding` and :mod:`.lab_masks` are the lab's, imported only where used.
"""

# verl first: ``import verl`` loads the plugin, which imports this package; a process whose first import is a core
# module would otherwise start verl's plugin loading inside a half-initialised module (verl swallows that error).
import verl  # noqa: F401
