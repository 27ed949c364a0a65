"""Layering: nothing in :mod:`stapo_verl.core` or :mod:`stapo_verl.algo` imports :mod:`stapo_verl.integration`.

``core`` holds what the upstream series copies into verl, ``algo`` the pure maths under it; ``integration`` is the
plugin's reach into verl 0.9.1's private API and what exists only for that release. An import the other way would
make the copied code depend on the backport, and could close an import cycle through ``integration``, which imports
``core``. Two checks:

* static, on the source of every module of both packages (``ast``, nothing imported): every ``import``, at any depth
  (inside functions and classes too), absolute or relative (``from ..integration import x``), and the forms that name
  the package without a dotted path (``from stapo_verl import integration``, ``importlib.import_module`` /
  ``__import__`` with a constant name). A scanner self-test shows each form is seen;
* dynamic, in a subprocess: importing ``stapo_verl.core.losses``, ``.registry``, ``.masks``, ``.seeding`` and every
  module of ``stapo_verl.algo`` leaves no ``stapo_verl.integration*`` in ``sys.modules``. ``import verl`` (which
  ``stapo_verl.core`` runs first) loads this plugin through its ``verl.plugins`` entry point, and the plugin imports
  ``stapo_verl.integration``: that would make the check meaningless, so the subprocess runs with
  ``VERL_USE_EXTERNAL_PLUGINS=none`` (verl's own switch: no entry point is loaded). What it then sees is only what
  ``core`` and ``algo`` import themselves, lazily imported code excepted (which the static check covers).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from support.procs import child_env

import stapo_verl

PACKAGE = Path(stapo_verl.__file__).parent
#: the packages that must not import FORBIDDEN
LOWER = ("core", "algo")
FORBIDDEN = "stapo_verl.integration"
#: calls whose first (constant) argument is the name of a module they import
IMPORT_CALLS = frozenset({"import_module", "__import__"})


def module_name(path: Path) -> str:
    """``stapo_verl.core.losses`` for ``<package>/core/losses.py`` (``stapo_verl.core`` for its ``__init__.py``)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of a (possibly relative) ``from … import``."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _forbidden(name: str) -> bool:
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


def forbidden_imports(module: str, source: str, is_package: bool = False) -> list[str]:
    """``"<module>:<line>: <statement>"`` for every import of :data:`FORBIDDEN` in ``source`` (module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            names = [node.args[0].value] if func in IMPORT_CALLS else []
        if any(_forbidden(n) for n in names):
            found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    return found


def lower_modules() -> dict[str, tuple[str, bool]]:
    """Every module of :data:`LOWER`: name → (source, is a package's ``__init__``)."""
    return {module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for pkg in LOWER for p in sorted((PACKAGE / pkg).rglob("*.py"))}


def test_core_and_algo_import_nothing_from_integration():
    modules = lower_modules()
    assert {"stapo_verl.core", "stapo_verl.core.losses", "stapo_verl.algo.s2t"} <= set(modules)
    found = [hit for name, (source, is_package) in modules.items()
             for hit in forbidden_imports(name, source, is_package)]
    assert found == [], "core/algo must not import stapo_verl.integration:\n" + "\n".join(found)


def test_the_scanner_sees_every_form_of_import():
    """Each form is found (at module level, in a function, in a method); look-alikes are not."""
    sample = '''
import stapo_verl.integration
from stapo_verl import integration
from stapo_verl.integration.verl_0_9_1 import policy_loss


def f():
    import stapo_verl.integration.post_import as p
    from ..integration import install
    from .. import integration as i
    import importlib
    importlib.import_module("stapo_verl.integration.verl_0_9_1")
    __import__("stapo_verl.integration")


class C:
    def m(self):
        from stapo_verl.integration.verl_0_9_1.policy_loss.config import stapo_target


from stapo_verl import algo, integrations_elsewhere  # not the package
from . import masks
import stapo_verl.integrationx
'''
    found = forbidden_imports("stapo_verl.core.sample", sample)
    assert [hit.split(":")[1] for hit in found] == ["2", "3", "4", "8", "9", "10", "12", "13", "18"], found
    assert forbidden_imports("stapo_verl.core", "from .. import integration", is_package=True) == [
        "stapo_verl.core:1: from .. import integration"]
    assert forbidden_imports("stapo_verl.core", "from . import integration", is_package=True) == []


def test_importing_core_and_algo_loads_no_integration():
    """Dynamic counterpart (module docstring): with verl's plugin loading switched off, importing the core modules
    the upstream series copies and every ``algo`` module leaves no ``stapo_verl.integration*`` in ``sys.modules``."""
    algo = sorted(module_name(p) for p in (PACKAGE / "algo").rglob("*.py"))
    modules = ["stapo_verl.core.registry", "stapo_verl.core.losses", "stapo_verl.core.masks",
               "stapo_verl.core.seeding", *algo]
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps({'plugin': 'stapo_verl.plugin' in sys.modules, 'verl': 'verl' in sys.modules, "
            f"'integration': sorted(m for m in sys.modules if m == {FORBIDDEN!r} or m.startswith({FORBIDDEN!r} + '.'))"
            "}))\n")
    env = child_env(VERL_USE_EXTERNAL_PLUGINS="none")
    env["PYTHONPATH"] = os.pathsep.join((str(PACKAGE.parent), env["PYTHONPATH"]))  # this checkout's stapo_verl
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["verl"] and not report["plugin"], report  # the check ran with verl, without the plugin
    assert report["integration"] == [], report
