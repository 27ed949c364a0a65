"""Ledger entries, and fingerprints of symbols of any installed package read from its source files with ``ast``
(nothing imported).

Every ledger of the package (the plugin's :data:`stapo_verl.integration.verl_0_9_1.PATCHES`, the CPU platform's
:mod:`stapo_verl.cpu.ledger`, the reward code's :mod:`stapo_verl.rewards.ledger`) lists :class:`Patch` entries and
honours one override, :data:`ALLOW_ENV`. Both live here because this module imports neither verl nor anything heavy:
the reward code checks its ledger in processes that never import verl.

A ledger entry (:class:`Patch`) pins the private symbol it patches or relies on by a *signature* and, when the code
copies or relies on a body, the *sha256* of that body's source. This module computes both for a dotted symbol of any
installed top-level package (verl, megatron-core, mbridge, torch, the standard library, math-verify, pebble): the
package is located with ``importlib.util.find_spec`` on its top-level name, which does not import it, and the module
file is read and parsed. Used by the CPU platform's and the reward code's ledgers; for verl
functions and ``from … import`` names it gives what :func:`stapo_verl.integration.verl_0_9_1.fingerprint` gives
(a unit test compares them on every plugin entry).

What a symbol's signature is:

* a function or method: ``(args) -> returns`` (``ast.unparse``), sha256 of its source;
* a class: ``class Name(bases)``, sha256 of its source;
* a module- or class-level variable: ``name: annotation = <kind of value>`` (``{…}`` for a dict literal,
  ``f(…)`` for a call), sha256 of the statement;
* a name bound by ``from m import x``: that statement (``from m import x``), no sha256; bound by ``import m``:
  ``import m``. When the symbol goes on past such a name (``torch._tensor.Tensor.type``), the lookup follows the
  import; a class member that the class body does not define is looked up in its bases (a C extension's members
  in the package's type stub, ``.pyi``).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import logging
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ALLOW_ENV", "Patch", "enforce_ledger", "fingerprint", "ledger_mismatches", "module_file"]

#: set to 1 to load the plugin on another verl version, or to run past any ledger's gate (the gates then only warn)
ALLOW_ENV = "STAPO_ALLOW_UNSUPPORTED_VERL"

#: how many imports / base classes a lookup follows before giving up (a cycle, or a symbol that is not there)
_MAX_HOPS = 8


@dataclass(frozen=True)
class Patch:
    """One ledger entry: a symbol of a package stapo-verl does not own that the code patches or relies on.

    Attributes:
        symbol: dotted path of the symbol.
        action: what the code does to it (an entry whose action starts with "relied on" changes nothing).
        why: the reason.
        upstream: what replaces it upstream (for verl: which PR of the series in ``upstream/``).
        remove_when: when to delete the patch.
        signature: the symbol's signature in the version written for (``ast.unparse`` of its arguments and
            return), or for a name bound by ``from … import``, that import statement (:func:`fingerprint`).
        source_sha256: sha256 of the symbol's source in that version, when the code copies or relies on its body.
    """

    symbol: str
    action: str
    why: str
    upstream: str
    remove_when: str
    signature: str
    source_sha256: str | None = None


def module_file(module: str) -> str | None:
    """Path of the source file of ``module`` (``.py``, else the type stub ``.pyi``), or None.

    Located from the top-level package's ``find_spec`` (which imports nothing for a top-level name), so it works
    for packages that are installed but not imported.
    """
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations is not None:
        roots = list(spec.submodule_search_locations)
    elif spec.origin and len(parts) == 1:
        return spec.origin if spec.origin.endswith((".py", ".pyi")) else None
    else:
        return None
    for root in roots:
        base = os.path.join(root, *parts[1:])
        for candidate in (base + ".py", os.path.join(base, "__init__.py"), base + ".pyi",
                          os.path.join(base, "__init__.pyi")):
            if os.path.isfile(candidate):
                return candidate
    return None


def _parsed(path: str, files: dict) -> tuple[str, ast.Module]:
    if path not in files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        files[path] = (source, ast.parse(source))
    return files[path]


def _value_kind(node: ast.AST | None) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Dict | ast.DictComp | ast.Set | ast.SetComp):
        return " = {…}"
    if isinstance(node, ast.List | ast.ListComp):
        return " = […]"
    if isinstance(node, ast.Tuple):
        return " = (…)"
    if isinstance(node, ast.Call):
        return f" = {ast.unparse(node.func)}(…)"
    if isinstance(node, ast.Constant):
        return f" = {node.value!r}"
    return " = …"


def _binds(stmt: ast.AST, name: str) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    return isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name


def _absolute(module: str, path: str, node: ast.ImportFrom) -> str:
    """The absolute module name of a (possibly relative) ``from … import``."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if not path.endswith(("__init__.py", "__init__.pyi")):
        package = package[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _resolve_expr(expr: ast.AST, module: str, path: str, tree: ast.Module) -> str | None:
    """The dotted name an expression such as a base class (``torch._C.TensorBase``, ``Base``) refers to."""
    if isinstance(expr, ast.Attribute):
        head = _resolve_expr(expr.value, module, path, tree)
        return None if head is None else f"{head}.{expr.attr}"
    if not isinstance(expr, ast.Name):
        return None
    for stmt in tree.body:
        if getattr(stmt, "name", None) == expr.id:
            return f"{module}.{expr.id}"
        if isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == expr.id:
                    return f"{_absolute(module, path, stmt)}.{alias.name}"
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == expr.id:
                    return alias.name
                if alias.asname is None and alias.name.split(".")[0] == expr.id:
                    return expr.id
    return None


def _lookup(symbol: str, files: dict, hops: int) -> tuple[str | None, str | None]:
    parts = symbol.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        path = module_file(module)
        if path is not None:
            break
    else:
        return None, None
    source, tree = _parsed(path, files)
    node: ast.AST = tree
    for j, name in enumerate(parts[i:], start=i):
        last = j == len(parts) - 1
        found = None
        for child in getattr(node, "body", []):
            if getattr(child, "name", None) == name or _binds(child, name):
                found = child  # the last definition wins (overloads, redefinitions)
            elif isinstance(child, ast.ImportFrom) and any((a.asname or a.name) == name for a in child.names):
                alias = next(a for a in child.names if (a.asname or a.name) == name)
                if last:
                    return f"from {child.module} import {name}", None
                target = f"{_absolute(module, path, child)}.{alias.name}"
                return _follow(target, parts[j + 1:], files, hops)
            elif isinstance(child, ast.Import) and node is tree:
                for alias in child.names:
                    if alias.asname == name or (alias.asname is None and alias.name == name):
                        if last:
                            return f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""), None
                        return _follow(alias.name, parts[j + 1:], files, hops)
        if found is None:
            if isinstance(node, ast.ClassDef):  # a member the class inherits
                for base in node.bases:
                    target = _resolve_expr(base, module, path, tree)
                    if target is not None:
                        result = _follow(target, parts[j:], files, hops)
                        if result[0] is not None:
                            return result
            return None, None
        if isinstance(found, ast.Assign | ast.AnnAssign) and not last:
            return None, None
        node = found
    segment = ast.get_source_segment(source, node) or ""
    digest = hashlib.sha256(segment.encode("utf-8")).hexdigest()
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else ""), digest
    if isinstance(node, ast.ClassDef):
        return f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)})", digest
    if isinstance(node, ast.Assign):
        return ast.unparse(node.targets[-1]) + _value_kind(node.value), digest
    if isinstance(node, ast.AnnAssign):
        return f"{ast.unparse(node.target)}: {ast.unparse(node.annotation)}" + _value_kind(node.value), digest
    return None, None


def _follow(target: str, rest: list[str], files: dict, hops: int) -> tuple[str | None, str | None]:
    if hops >= _MAX_HOPS:
        return None, None
    return _lookup(".".join([target, *rest]), files, hops + 1)


def fingerprint(symbol: str, files: dict | None = None) -> tuple[str | None, str | None]:
    """``(signature, source sha256)`` of a symbol of an installed package, read from its source (module docstring).

    Args:
        symbol: dotted path, e.g. ``"verl.utils.distributed.initialize_global_process_group_ray"``.
        files: a dict the caller owns, filled with the files parsed (path → (source, tree)) so that checking many
            symbols of one file parses it once; ``None`` parses afresh.

    Returns:
        ``(None, None)`` when the package, module or symbol does not exist.
    """
    return _lookup(symbol, {} if files is None else files, 0)


def ledger_mismatches(patches: Iterable, written_for: str) -> list[str]:
    """One line per ledger entry whose symbol is missing or whose signature or source differs.

    Args:
        patches: ledger entries (``symbol``, ``signature``, ``source_sha256``; :class:`Patch`).
        written_for: what the ledger was written against, for the messages (``"megatron-core 0.16.1"``).
    """
    files: dict = {}
    problems = []
    for patch in patches:
        signature, digest = fingerprint(patch.symbol, files)
        if signature is None:
            problems.append(f"{patch.symbol}: not found")
        elif signature != patch.signature:
            problems.append(f"{patch.symbol}: signature {signature!r}, expected {patch.signature!r}")
        elif patch.source_sha256 is not None and digest != patch.source_sha256:
            problems.append(f"{patch.symbol}: source differs from {written_for}'s (sha256 {digest[:12]}…)")
    return problems


def enforce_ledger(patches: Iterable, written_for: str, *, owner: str, remedy: str,
                   error: type[BaseException], log: logging.Logger) -> None:
    """The gate every ledger's ``check`` runs: raise ``error`` unless every entry's symbol exists with the signature
    (and source hash) it was written for.

    Args:
        patches: ledger entries (:class:`Patch`). written_for: what they were written against (for the message).
        owner: the part of stapo-verl the ledger belongs to, e.g. ``"CPU platform (VERL_PLATFORM=cpu)"``.
        remedy: what the user should do, ending with what :data:`ALLOW_ENV` lets them do anyway.
        error: the exception class to raise. log: the ledger module's logger (the warning is logged there too).

    Raises:
        error: a symbol is missing or differs (the message names the first one and the count), unless
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` (then a warning on ``warnings`` and ``log``, listing every difference).
    """
    problems = ledger_mismatches(patches, written_for)
    if not problems:
        return
    message = (f"stapo-verl's {owner} was written for {written_for}; {len(problems)} site(s) differ, first: "
               f"{problems[0]}. {remedy}")
    if os.environ.get(ALLOW_ENV, "") == "1":
        warnings.warn(f"{message} Proceeding because {ALLOW_ENV}=1. All differences: {problems}", stacklevel=3)
        log.warning("%s Proceeding because %s=1.", message, ALLOW_ENV)
        return
    raise error(message)
