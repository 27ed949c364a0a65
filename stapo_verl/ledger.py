"""Ledger entries (:class:`Patch`): symbols of packages stapo-verl does not own, pinned by signature and source sha256
(:func:`fingerprint`, read with ``ast`` from the installed files, importing nothing). Imports, base classes and
variables are followed by :mod:`stapo_verl.ledger_follow`, loaded only then. Gate: :mod:`stapo_verl.ledger_gate`."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

#: set to 1 to load the plugin on another verl version, or to run past any ledger's gate (the gates then only warn)
ALLOW_ENV = "STAPO_ALLOW_UNSUPPORTED_VERL"


@dataclass(frozen=True)
class Patch:
    """One ledger entry: ``symbol`` (dotted path), what the code does to it (``action``; "relied on …" changes nothing),
    ``why``, what replaces it ``upstream``, when to remove it (``remove_when``), and its ``signature`` and, when the
    code copies or relies on its body, ``source_sha256`` in the version written for (:func:`fingerprint`)."""

    symbol: str
    action: str
    why: str
    upstream: str
    remove_when: str
    signature: str
    source_sha256: str | None = None


def module_file(module: str) -> str | None:
    """Path of ``module``'s source (``.py``, else the stub ``.pyi``), or None; found from ``find_spec`` of its
    top-level name, which imports nothing."""
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.submodule_search_locations is None:  # not installed, or a single-file module
        origin = spec.origin if spec is not None and not rest else None
        return origin if origin and origin.endswith((".py", ".pyi")) else None
    candidates = (c for root in spec.submodule_search_locations for b in [os.path.join(root, *rest)]
                  for c in (b + ".py", os.path.join(b, "__init__.py"), b + ".pyi", os.path.join(b, "__init__.pyi")))
    return next((c for c in candidates if os.path.isfile(c)), None)


def _may_bind(stmt: ast.AST, name: str) -> bool:
    """Whether an import or assignment statement may bind ``name`` (then :mod:`stapo_verl.ledger_follow` decides)."""
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return any((a.asname or a.name) == name for a in stmt.names)
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return isinstance(stmt, ast.Assign | ast.AnnAssign) and any(getattr(t, "id", None) == name for t in targets)


def _lookup(symbol: str, files: dict, hops: int) -> tuple[str | None, str | None]:
    parts = symbol.split(".")
    for i in range(len(parts) - 1, 0, -1):
        if (path := module_file(module := ".".join(parts[:i]))) is not None:
            break
    else:
        return None, None
    if path not in files:
        with open(path, encoding="utf-8") as f:
            files[path] = (source := f.read(), ast.parse(source))
    source, tree = files[path]
    node: ast.AST = tree
    for j, name in enumerate(parts[i:], start=i):
        body = getattr(node, "body", [])
        named = [child for child in body if getattr(child, "name", None) == name]  # defs and classes
        if named and not any(_may_bind(child, name) for child in body):
            node = named[-1]  # the last definition wins (overloads, redefinitions)
            continue
        from stapo_verl.ledger_follow import member

        if isinstance(node := member(_lookup, node, tree, name, parts[j + 1:], module, path, files, hops), tuple):
            return node
    digest = hashlib.sha256((ast.get_source_segment(source, node) or "").encode("utf-8")).hexdigest()
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return f"({ast.unparse(node.args)})" + (f" -> {ast.unparse(node.returns)}" if node.returns else ""), digest
    if isinstance(node, ast.ClassDef):
        return f"class {node.name}({', '.join(ast.unparse(b) for b in node.bases)})", digest
    from stapo_verl.ledger_follow import variable_signature

    return variable_signature(node), digest


def fingerprint(symbol: str, files: dict | None = None) -> tuple[str | None, str | None]:
    """``(signature, sha256 of its source)`` of ``symbol`` (dotted path into an installed package), read from source:
    ``(args) -> returns``, ``class Name(bases)``, ``name: annotation = <kind of value>``, or for a name bound by an
    import that statement (sha256 None); ``(None, None)`` if not found. ``files``: a dict the caller owns, filled with
    the files parsed (path → (source, tree)) so that each is parsed once; ``None`` parses afresh."""
    return _lookup(symbol, {} if files is None else files, 0)


def ledger_mismatches(patches: Iterable, written_for: str) -> list[str]:
    """One line per entry of ``patches`` (:class:`Patch`) whose symbol is missing or whose signature or source
    differs; ``written_for`` (``"megatron-core 0.16.1"``) is what the ledger was written against, for the messages."""
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
