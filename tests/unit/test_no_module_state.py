"""No mutable module-level state in the plugin core: what a function needs comes in through its arguments or the
batch. Checked on the AST of every module of ``stapo_verl.core``, ``stapo_verl.algo``, ``stapo_verl.minibatch``,
``stapo_verl.diagnostics`` and ``stapo_verl.integration``: a module-level assignment may bind only constants (numbers, strings, tuples/frozensets of
them), a call that builds an immutable object, a type alias, or a function/class. ``global`` statements are refused.
The one exception is the policy-token-mask registry, which is the extension point itself (it mirrors verl's
``POLICY_LOSS_REGISTRY``) and is filled at import by ``@register_policy_token_mask``."""

import ast
from pathlib import Path

import pytest

import stapo_verl

PACKAGE = Path(stapo_verl.__file__).parent
CORE = ("core", "algo", "minibatch", "diagnostics", "integration")
ALLOWED_MUTABLE = {("core/registry.py", "POLICY_TOKEN_MASK_REGISTRY")}
#: calls whose result is immutable (or a logger / type alias / lock-free helper)
IMMUTABLE_CALLS = {"frozenset", "tuple", "getLogger", "Callable", "MappingProxyType", "Patch", "TypeVar"}


def _immutable(node) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Tuple):
        return all(_immutable(e.value if isinstance(e, ast.Starred) else e) for e in node.elts)
    if isinstance(node, ast.BinOp | ast.UnaryOp | ast.JoinedStr | ast.Attribute | ast.Name | ast.Subscript):
        return True  # arithmetic on constants, f-strings, aliases of existing names, typing subscripts
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "MappingProxyType":  # a read-only view of a literal nobody else holds
            return all(isinstance(a, ast.Dict) for a in node.args)
        return name in IMMUTABLE_CALLS and all(_immutable(a) for a in node.args)
    return False


def _module_state(path: Path):
    rel = str(path.relative_to(PACKAGE))
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            yield rel, f"global {', '.join(node.names)} (line {node.lineno})"
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                name = getattr(t, "id", ast.unparse(t))
                if (rel, name) not in ALLOWED_MUTABLE and not _immutable(node.value):
                    yield rel, f"{name} = {ast.unparse(node.value)[:60]} (line {node.lineno})"


FILES = sorted(p for part in CORE for p in (PACKAGE / part).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_mutable_module_level_state(path):
    assert list(_module_state(path)) == []


def test_the_check_sees_mutable_state(tmp_path):
    bad = PACKAGE / "core" / "_probe_state.py"
    bad.write_text("import itertools\nSTATE = {}\nCOUNTER = itertools.count()\nOK = (1, 'a')\n")
    try:
        found = [msg.split(" =")[0] for _, msg in _module_state(bad)]
    finally:
        bad.unlink()
    assert found == ["STATE", "COUNTER"]
