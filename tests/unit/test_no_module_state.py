"""No mutable module-level state anywhere in ``stapo_verl``: what a function needs comes in through its arguments, the
batch, or an object the caller owns. Checked on the source of every module of every subpackage (and the top-level
modules), with ``ast``; nothing is imported and nothing is written into the package.

What counts as state (each is refused, except the bindings listed in :data:`ALLOWED` with their reason):

* a ``global`` statement, anywhere;
* a module-level or class-level binding whose value is not immutable: a dict/list/set literal or comprehension
  (``X = {}``, ``X: dict = {}``, ``X = [f(y) for y in Z]``), a generator, a call that is not known to build an
  immutable object (``defaultdict(...)``, ``dict(...)``, ``itertools.count()``, ``threading.Lock()``, an instance
  of a class that is not a frozen dataclass / ``NamedTuple`` / ``Enum``), or an alias of such a binding
  (``X = Y`` or ``X = Y.attr`` where ``Y`` is one), at any depth of module-level ``if`` / ``try`` / ``with`` blocks;
* an assignment at module level to an attribute or item of another object (``mod.attr = ...``, ``D[k] = ...``):
  state written into someone else's object at import;
* a function cached for the process (``functools.lru_cache`` / ``functools.cache`` / ``cachetools.cached`` on a
  module-level function or a method): the cache is a mutable dict that outlives every call, so a result can come from
  before the process changed (a library replaced in a test, another configuration), and it grows with the inputs.
  ``functools.cached_property`` is allowed: its value lives on the instance, which its caller owns.

Immutable: constants, tuples / frozensets of immutables, f-strings and arithmetic on them, functions (``def``,
``lambda``), classes, imported names and their attributes, ``typing`` aliases (subscripts), ``MappingProxyType`` of a
literal or comprehension nobody else holds, and calls in :data:`IMMUTABLE_CALLS` (each with its reason) or of a class
of the package that is a frozen dataclass, ``NamedTuple`` or ``Enum``. ``__all__`` may be a list: Python's
``import *`` reads it, and the rule above means nothing in the package can append to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stapo_verl

PACKAGE = Path(stapo_verl.__file__).parent

#: (module path relative to the package, name) → why this mutable binding stays
ALLOWED = {
    ("core/registry.py", "POLICY_TOKEN_MASK_REGISTRY"): "the policy-token-mask registry is the extension point itself "
    "(it mirrors verl's POLICY_LOSS_REGISTRY) and is filled at import by @register_policy_token_mask",
}

#: calls whose result is immutable, or not ours to own, with the reason
IMMUTABLE_CALLS = {
    "tuple": "an immutable sequence (of immutable items, checked)",
    "frozenset": "an immutable set (of immutable items, checked)",
    "MappingProxyType": "a read-only view (of a literal or comprehension nobody else holds, checked)",
    "getLogger": "a logger belongs to logging's manager, which creates it once per name; not this module's state",
    "TypeVar": "a typing construct",
    "NewType": "a typing construct",
    "namedtuple": "a class",
    "compile": "a compiled regular expression (re.compile) is immutable",
    "Fraction": "an immutable number",
    "device": "torch.device is immutable",
    "field": "a dataclass field declaration (dataclasses.field), consumed by the class decorator",
    "version": "importlib.metadata.version returns a str",
    "type": "a class (type(None))",
    **{b: "a builtin that returns an immutable value" for b in ("str", "int", "float", "complex", "bool", "bytes",
                                                              "range", "len", "repr", "chr", "ord")},
}

#: decorators that cache a function's results for the process
CACHING_DECORATORS = frozenset({"lru_cache", "cache", "cached"})


def immutable_classes(sources: dict[str, str]) -> frozenset[str]:
    """Names of the classes in ``sources`` whose instances are immutable: frozen dataclasses, ``NamedTuple`` s,
    ``Enum`` s."""
    names = set()
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            frozen = any(
                isinstance(d, ast.Call) and ast.unparse(d.func).rsplit(".", 1)[-1] == "dataclass"
                and any(k.arg == "frozen" and getattr(k.value, "value", False) is True for k in d.keywords)
                for d in node.decorator_list)
            if frozen or bases & {"NamedTuple", "Enum", "IntEnum", "StrEnum"}:
                names.add(node.name)
    return frozenset(names)


def _statements(body: list[ast.stmt]):
    """The statements of a module or class body, including those inside module-level if/try/with/for blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.For | ast.While | ast.With):
            yield from _statements(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from _statements(node.body + node.orelse + node.finalbody
                                   + [s for h in node.handlers for s in h.body])


def _name_of(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _bound_names(target: ast.AST):
    """The names an assignment target binds (``x``, ``x, y``, ``*x``), not those it only reads (``x[k]``, ``x.a``)."""
    if isinstance(target, ast.Name):
        yield target
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


class _Scope:
    """The module-level bindings of one module, to decide whether a name refers to a mutable object."""

    def __init__(self, tree: ast.Module, classes: frozenset[str]):
        self.classes = classes
        self.values: dict[str, ast.AST | None] = {}  # name → bound value (None: def / class / import)
        for node in _statements(tree.body):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in _bound_names(target):
                        self.values[name.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.values[node.target.id] = node.value
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.values.setdefault(node.name, None)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    self.values.setdefault((alias.asname or alias.name).split(".")[0], None)

    def name_is_mutable(self, name: str, seen: frozenset[str]) -> bool:
        if name in seen or self.values.get(name) is None:
            return False  # builtins, imports, functions, classes; a cycle is reported at its first binding
        return not self.immutable(self.values[name], seen | {name})

    def immutable(self, node: ast.AST, seen: frozenset[str] = frozenset(), local: frozenset[str] = frozenset()
                  ) -> bool:
        """Whether the object ``node`` evaluates to is immutable (module docstring). ``local``: comprehension
        variables (items of an iterable; their immutability is the iterable's business)."""
        if isinstance(node, ast.Constant | ast.JoinedStr | ast.Lambda | ast.Compare):
            return True
        if isinstance(node, ast.Tuple):
            return all(self.immutable(e.value if isinstance(e, ast.Starred) else e, seen, local) for e in node.elts)
        if isinstance(node, ast.Name):
            return node.id in local or not self.name_is_mutable(node.id, seen)
        if isinstance(node, ast.Attribute | ast.Subscript):
            root = node
            while isinstance(root, ast.Attribute | ast.Subscript):
                root = root.value
            return not (isinstance(root, ast.Name) and root.id not in local and self.name_is_mutable(root.id, seen))
        if isinstance(node, ast.BinOp):
            return self.immutable(node.left, seen, local) and self.immutable(node.right, seen, local)
        if isinstance(node, ast.UnaryOp):
            return self.immutable(node.operand, seen, local)
        if isinstance(node, ast.BoolOp):
            return all(self.immutable(v, seen, local) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.immutable(node.body, seen, local) and self.immutable(node.orelse, seen, local)
        if isinstance(node, ast.Call):
            return self._immutable_call(node, seen, local)
        return False  # dict / list / set literals and comprehensions, generators, await, ...

    def _items_immutable(self, node: ast.AST, seen: frozenset[str], local: frozenset[str]) -> bool:
        """The items of an iterable argument of tuple() / frozenset() are immutable."""
        if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp):
            names = frozenset(n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name))
            return self.immutable(node.elt, seen, local | names)
        if isinstance(node, ast.List | ast.Set | ast.Tuple):
            return all(self.immutable(e, seen, local) for e in node.elts)
        return self.immutable(node, seen, local)

    def _immutable_call(self, node: ast.Call, seen: frozenset[str], local: frozenset[str]) -> bool:
        name = _name_of(node.func)
        if name == "MappingProxyType":
            if len(node.args) != 1:
                return False
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                return all(self.immutable(v, seen, local) for v in arg.values)
            if isinstance(arg, ast.DictComp):
                names = frozenset(n.id for g in arg.generators for n in ast.walk(g.target) if isinstance(n, ast.Name))
                return self.immutable(arg.value, seen, local | names)
            return False  # a view of a dict someone else holds is that dict
        if name in ("tuple", "frozenset"):
            return all(self._items_immutable(a, seen, local) for a in node.args)
        if name in IMMUTABLE_CALLS or name in self.classes:
            return all(self.immutable(a, seen, local) for a in node.args) and all(
                self.immutable(k.value, seen, local) for k in node.keywords)
        return False


def module_state(source: str, rel: str, classes: frozenset[str] = frozenset()) -> list[str]:
    """Every piece of module-level mutable state in one module's source (module docstring), as
    ``"<name> = <value> (line n)"`` / ``"global x (line n)"`` / ... lines; bindings in :data:`ALLOWED` excepted.

    Args:
        source: the module's source text.
        rel: its path relative to the package (the key of :data:`ALLOWED`).
        classes: names of the package's immutable classes (:func:`immutable_classes`).
    """
    tree = ast.parse(source)
    scope = _Scope(tree, classes)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"global {', '.join(node.names)} (line {node.lineno})")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if _name_of(deco.func if isinstance(deco, ast.Call) else deco) in CACHING_DECORATORS:
                    found.append(f"@{ast.unparse(deco)} {node.name} (line {node.lineno})")

    def check_body(body: list[ast.stmt], prefix: str) -> None:
        for node in _statements(body):
            if isinstance(node, ast.ClassDef):
                check_body(node.body, f"{prefix}{node.name}.")
                continue
            if isinstance(node, ast.AugAssign):
                found.append(f"{prefix}{ast.unparse(node)} (line {node.lineno})")
                continue
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute | ast.Subscript):
                        found.append(f"{prefix}{ast.unparse(t)} = {ast.unparse(node.value)[:60]} (line "
                                     f"{node.lineno}): written into another object at import")
                        break
                for t in _bound_names(target):
                    name = f"{prefix}{t.id}"
                    if (rel, name) not in ALLOWED and name != "__all__" and not scope.immutable(node.value):
                        found.append(f"{name} = {ast.unparse(node.value)[:60]} (line {node.lineno})")

    check_body(tree.body, "")
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
SOURCES = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8") for p in FILES}
CLASSES = immutable_classes(SOURCES)


def test_every_subpackage_is_checked():
    """Every package directory of ``stapo_verl`` (and its top-level modules) is among the checked files."""
    packages = {p.parent for p in PACKAGE.rglob("__init__.py")}
    checked = {p.parent for p in FILES}
    assert packages <= checked and len(packages) >= 12, sorted(str(p) for p in packages - checked)
    assert {"plugin.py", "__init__.py", "rewards/worker.py", "cpu/__init__.py", "launch/dryrun.py"} <= set(SOURCES)


@pytest.mark.parametrize("rel", sorted(SOURCES))
def test_no_mutable_module_level_state(rel):
    assert module_state(SOURCES[rel], rel, CLASSES) == []


def test_allowed_bindings_exist():
    """Every exception in :data:`ALLOWED` still names a binding of its module (no stale reason)."""
    for rel, name in ALLOWED:
        tree = ast.parse(SOURCES[rel])
        bound = {t.id for n in _statements(tree.body) if isinstance(n, ast.Assign | ast.AnnAssign)
                 for t in _bound_names(n.targets[0] if isinstance(n, ast.Assign) else n.target)}
        assert name in bound, (rel, name)


SAMPLE = '''
import collections, functools, itertools, re, threading
from dataclasses import dataclass
from types import MappingProxyType

OK_NUMBER = 1 << 20
OK_TUPLE = (1, "a", (2.0, None))
OK_FROZEN = frozenset({"a", "b"})
OK_VIEW = MappingProxyType({"a": 1, "b": (2, 3)})
OK_VIEW_COMP = MappingProxyType({k: k * 2 for k in range(3)})
OK_TUPLE_COMP = tuple(str(i) for i in range(3))
OK_REGEX = re.compile("a+")
OK_ALIAS = OK_TUPLE
OK_ATTR = itertools.chain
OK_FN = lambda x: x


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0


OK_POINT = Point(1, 2)
STATE = {}
ANNOTATED: dict = {}
LISTED = []
COUNTER = itertools.count()
DEFAULTS = collections.defaultdict(list)
LOCK = threading.Lock()
SQUARES = [i * i for i in range(3)]
SEEN = {i for i in range(3)}
INDEX = {i: i for i in range(3)}
ONCE = (i for i in range(3))
ALIAS = STATE
ALIAS_ATTR = STATE.get
VIEW_OF_STATE = MappingProxyType(STATE)
TUPLE_OF_LISTS = tuple([i] for i in range(3))
NESTED = (1, [2])
try:
    HIDDEN = dict()
except ImportError:
    HIDDEN = None
OK_POINT.x = 3
STATE["k"] = 1
OK_NUMBER += 1


class Holder:
    CLASS_CACHE = {}
    OK_CLASS_CONST = ("x",)

    @functools.lru_cache(maxsize=8)
    def method(self):
        return 1


@functools.cache
def cached():
    return 1


def setter():
    global STATE
    STATE = {}
'''

SAMPLE_FOUND = ["global STATE", "@functools.lru_cache(maxsize=8) method", "@functools.cache cached", "STATE",
                "ANNOTATED", "LISTED", "COUNTER", "DEFAULTS", "LOCK", "SQUARES", "SEEN", "INDEX", "ONCE", "ALIAS",
                "ALIAS_ATTR", "VIEW_OF_STATE", "TUPLE_OF_LISTS", "NESTED", "HIDDEN", "OK_POINT.x", "STATE['k']",
                "OK_NUMBER += 1", "Holder.CLASS_CACHE"]


def _names(found: list[str]) -> list[str]:
    return sorted(line.split(" (line")[0].split(" = ")[0] for line in found)


def test_the_check_sees_mutable_state():
    """The check fails on a sample with every kind of state it refuses (and passes what it should)."""
    found = module_state(SAMPLE, "sample.py", immutable_classes({"sample.py": SAMPLE}))
    assert _names(found) == sorted(SAMPLE_FOUND), found


def test_the_check_reads_a_file_outside_the_package(tmp_path):
    """The same check on a module written to a temporary directory (never into the package), as the suite runs it."""
    path = tmp_path / "probe_state.py"
    path.write_text("import itertools\nSTATE = {}\nCOUNTER = itertools.count()\nOK = (1, 'a')\nALIAS = STATE\n")
    assert _names(module_state(path.read_text(), "probe_state.py")) == ["ALIAS", "COUNTER", "STATE"]
    assert not (PACKAGE / "probe_state.py").exists()
