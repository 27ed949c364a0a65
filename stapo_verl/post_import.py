"""Run a function right after a module is first imported (a post-import hook), without importing it ourselves.

The plugin patches verl / megatron-core / mbridge modules that most processes never import (the worker stack, the
Megatron engine, ``main_ppo``). :func:`when_imported` applies a patch at once when the module is already in
``sys.modules`` and otherwise when Python first executes it, so loading the plugin costs no extra imports.
One meta-path finder serves every hook of the package.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType

_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}


def _run(module: ModuleType) -> None:
    for fn in _HOOKS.get(module.__name__, ()):
        fn(module)


class _Loader(importlib.abc.Loader):
    """Delegating loader: runs the hooks after the module body; forwards ``get_code`` etc. (``python -m`` needs them)."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _run(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of hooked modules only; every other import is untouched (returns None)."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def when_imported(module_name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call ``fn(module)`` now if ``module_name`` is imported, else right after its first import.

    Args:
        module_name: dotted module name (e.g. ``"verl.workers.engine_workers"``).
        fn: the patch; must be idempotent (it may also run when the module is imported again after a reload).
    Registering the same ``fn`` twice for a module is a no-op. A module run as ``__main__`` (``python -m``) is not
    seen under its dotted name.
    """
    fns = _HOOKS.setdefault(module_name, [])
    if fn not in fns:
        fns.append(fn)
    if module_name in sys.modules:
        fn(sys.modules[module_name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
