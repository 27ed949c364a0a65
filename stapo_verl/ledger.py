"""Ledger entries (:class:`Patch`), and the fingerprints that pin them, read from source files with ``ast``.

Every ledger (the plugin's :data:`stapo_verl.integration.verl_0_9_1.PATCHES`, :mod:`stapo_verl.cpu.ledger`,
:mod:`stapo_verl.rewards.ledger`) pins each symbol of a package it does not own by a *signature* and, where the code
copies or relies on a body, the *sha256* of that body's source; :data:`ALLOW_ENV` overrides every gate. The package is
found with ``importlib.util.find_spec`` on its top-level name and its file parsed: nothing is imported (the reward code
checks its ledger in processes that never import verl). A signature is, for a function ``(args) -> returns``, for a
class ``class Name(bases)``, for a variable ``name: annotation = <kind of value>``, for a name bound by an import that
statement (no sha256). A symbol reached through an import or a base class (``torch._tensor.Tensor.type``) is looked up
by :mod:`stapo_verl.ledger_follow`, imported only then (the plugin's own entries are defined where they are named);
the gate of the CPU platform's and the reward code's ledgers is :mod:`stapo_verl.ledger_gate`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ALLOW_ENV", "Patch", "fingerprint", "ledger_mismatches", "module_file"]

#: set to 1 to load the plugin on another verl version, or to run past any ledger's gate (the gates then only warn)
ALLOW_ENV = "STAPO_ALLOW_UNSUPPORTED_VERL"


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


def _binds(stmt: ast.AST, name: str) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    return isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name


def _imported(stmt: ast.AST, name: str, at_module_level: bool):
    """The alias of an ``import`` / ``from … import`` statement that binds ``name``, or None."""
    if isinstance(stmt, ast.ImportFrom):
        return next((a for a in stmt.names if (a.asname or a.name) == name), None)
    if isinstance(stmt, ast.Import) and at_module_level:
        return next((a for a in stmt.names if a.asname == name or (a.asname is None and a.name == name)), None)
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
            elif (alias := _imported(child, name, node is tree)) is not None:
                from stapo_verl.ledger_follow import through_import

                return through_import(_lookup, child, alias, module, path, parts[j + 1:], files, hops)
        if found is None:
            if isinstance(node, ast.ClassDef) and node.bases:  # a member the class inherits
                from stapo_verl.ledger_follow import through_bases

                return through_bases(_lookup, node, module, path, tree, parts[j:], files, hops)
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
    if isinstance(node, ast.Assign | ast.AnnAssign):
        from stapo_verl.ledger_follow import variable_signature

        return variable_signature(node), digest
    return None, None


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
