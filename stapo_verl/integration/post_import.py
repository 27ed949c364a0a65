"""Run a patch right after a module is first imported, without importing it ourselves (``wrapt`` post-import hooks).

The plugin patches verl / megatron-core / mbridge modules that most processes never import (the worker stack, the
Megatron engine, ``main_ppo``), so loading the plugin must not import them. ``wrapt.register_post_import_hook``
calls the hook at once when the module is already imported, else right after its first import. A module run as
``__main__`` (``python -m``) is not seen under its dotted name. Source: https://wrapt.readthedocs.io (post-import
hooks, PEP 369 semantics).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import wrapt


def when_imported(module_name: str, patch: Callable[[ModuleType], None] | str) -> None:
    """Call ``patch(module)`` now if ``module_name`` is imported, else right after its first import.

    Args:
        module_name: dotted module name, e.g. ``"verl.workers.engine_workers"``.
        patch: must be idempotent (it may run more than once, e.g. when the plugin is installed twice). A string
            ``"package.module:function"`` names it without importing it: wrapt imports ``package.module`` when the
            hook fires (``wrapt.register_post_import_hook``'s deferred hook).
    """
    wrapt.register_post_import_hook(patch, module_name)
