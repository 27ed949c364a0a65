"""The parts of :mod:`stapo_verl.ledger`'s lookup a job that asks only for the plugin's mask does not need (its entries
are all defined where they are named): names bound by assignments or imports, members inherited from base classes, and
the signature of a variable; imported when a lookup needs them. ``lookup``: :mod:`stapo_verl.ledger`'s
``_lookup(symbol, files, hops)``."""

from __future__ import annotations

import ast
from collections.abc import Callable

#: how many imports / base classes a lookup follows before giving up (a cycle, or a symbol that is not there)
_MAX_HOPS = 8


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


def variable_signature(node: ast.Assign | ast.AnnAssign) -> str:
    """``name = <kind of value>`` or ``name: annotation = <kind>`` (``{…}``: a dict literal, ``f(…)``: a call)."""
    if isinstance(node, ast.Assign):
        return ast.unparse(node.targets[-1]) + _value_kind(node.value)
    return f"{ast.unparse(node.target)}: {ast.unparse(node.annotation)}" + _value_kind(node.value)


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


def _follow(lookup: Callable, target: str, rest: list[str], files: dict, hops: int) -> tuple[str | None, str | None]:
    if hops >= _MAX_HOPS:
        return None, None
    return lookup(".".join([target, *rest]), files, hops + 1)


def through_import(lookup: Callable, stmt: ast.Import | ast.ImportFrom, alias: ast.alias, module: str, path: str,
                   rest: list[str], files: dict, hops: int) -> tuple[str | None, str | None]:
    """The fingerprint of a symbol bound by ``stmt`` (``alias``): the statement itself when the symbol ends there
    (``rest`` empty), else the lookup of ``rest`` in what it imports."""
    if isinstance(stmt, ast.ImportFrom):
        if not rest:
            return f"from {stmt.module} import {alias.asname or alias.name}", None
        return _follow(lookup, f"{_absolute(module, path, stmt)}.{alias.name}", rest, files, hops)
    if not rest:
        return f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""), None
    return _follow(lookup, alias.name, rest, files, hops)


def through_bases(lookup: Callable, node: ast.ClassDef, module: str, path: str, tree: ast.Module, rest: list[str],
                  files: dict, hops: int) -> tuple[str | None, str | None]:
    """The fingerprint of the member ``rest`` of the class ``node`` that its body does not define: from the first
    base that has it."""
    for base in node.bases:
        target = _resolve_expr(base, module, path, tree)
        if target is not None:
            result = _follow(lookup, target, rest, files, hops)
            if result[0] is not None:
                return result
    return None, None


def _binds(stmt: ast.AST, name: str) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
    return isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name


def _imported(stmt: ast.AST, name: str, at_module_level: bool) -> ast.alias | None:
    """The alias of an ``import`` / ``from … import`` statement that binds ``name``, or None."""
    if isinstance(stmt, ast.ImportFrom):
        return next((a for a in stmt.names if (a.asname or a.name) == name), None)
    if isinstance(stmt, ast.Import) and at_module_level:
        return next((a for a in stmt.names if a.asname == name or (a.asname is None and a.name == name)), None)
    return None


def member(lookup: Callable, node: ast.AST, tree: ast.Module, name: str, rest: list[str], module: str, path: str,
           files: dict, hops: int) -> ast.AST | tuple[str | None, str | None]:
    """The statement of the body of ``node`` (``tree``, the module ``module`` read from ``path``, or a class in it)
    that defines or assigns ``name``, the last one winning; else the fingerprint of ``name`` followed by the parts
    ``rest``: through the first import that binds ``name`` (which wins over any definition), through the bases of a
    class that does not define it, or ``(None, None)`` (also for a member of a variable)."""
    found = None
    for child in getattr(node, "body", []):
        if getattr(child, "name", None) == name or _binds(child, name):
            found = child  # the last definition wins (overloads, redefinitions)
        elif (alias := _imported(child, name, node is tree)) is not None:
            return through_import(lookup, child, alias, module, path, rest, files, hops)
    if found is None:
        if isinstance(node, ast.ClassDef) and node.bases:  # a member the class inherits
            return through_bases(lookup, node, module, path, tree, [name, *rest], files, hops)
        return None, None
    if isinstance(found, ast.Assign | ast.AnnAssign) and rest:
        return None, None
    return found
