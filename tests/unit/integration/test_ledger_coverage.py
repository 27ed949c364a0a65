"""The ledger (:data:`stapo_verl.integration.verl_0_9_1.PATCHES`) covers every place the plugin touches a verl object.

Found on the AST of the plugin's integration package (the CPU platform has a ledger of its own), so a new patch
without a ledger entry turns this test red:

* functions marked as installed wrappers (``setattr(fn, _MARK, True)``): the wrapped symbol is in the ledger;
* attributes assigned on objects other than ``self``/``cls`` (a module's function rebound, a worker group's or an
  engine's method overridden on the instance): the attribute is a ledger symbol or named in an entry's action;
* state kept on verl objects (``_stapo_*`` attributes, ``obj.__dict__[...]`` and ``__dict__.setdefault``): the
  attribute's name is in an entry's action;
* ``unittest.mock.patch`` / ``patch.object`` anywhere in the package outside the CPU platform: the patched name is
  in an entry's action.
"""

import ast
import re
from pathlib import Path

import pytest

import stapo_verl
from stapo_verl.integration.verl_0_9_1.opt_in_ledger import all_patches

PACKAGE = Path(stapo_verl.__file__).parent
INTEGRATION = PACKAGE / "integration"
#: attribute assignments on the plugin's own objects (not verl's), with the reason
OWN_OBJECTS = {"cursor": "training_worker.MiniBatchCursor, the plugin's own per-update state"}
MARK = "_MARK"


def _sources(root: Path, exclude: tuple[str, ...] = ()):
    for path in sorted(root.rglob("*.py")):
        if not any(part in exclude for part in path.relative_to(PACKAGE).parts):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def _string(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_constants(tree) -> dict[str, str]:
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and _string(node.value) is not None}


def touched(tree) -> dict[str, set[str]]:
    """What one module touches: ``wrapped`` function names, ``assigned`` attributes, ``state`` names, ``mocked``."""
    constants = _module_constants(tree)
    found = {"wrapped": set(), "assigned": set(), "state": set(), "mocked": set()}

    def name_of(node) -> str | None:
        value = _string(node)
        return value if value is not None else constants.get(getattr(node, "id", None))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func == "setattr" and len(node.args) == 3:
                attr = name_of(node.args[1])
                if getattr(node.args[1], "id", None) == MARK:
                    found["wrapped"].add(ast.unparse(node.args[0]))
                elif attr is not None:
                    found["state" if attr.startswith("_stapo") else "assigned"].add(attr)
            elif func.endswith("__dict__.setdefault") and node.args:
                found["state"].add(name_of(node.args[0]) or ast.unparse(node.args[0]))
            elif func.split(".")[-1] in ("patch", "object") and "mock" in func:
                args = [name_of(a) or ast.unparse(a) for a in node.args[:2]]
                found["mocked"].add(".".join(args) if func.endswith("object") else args[0])
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AugAssign | ast.AnnAssign) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and ast.unparse(target.value).endswith("__dict__"):
                found["state"].add(name_of(target.slice) or ast.unparse(target.slice))
            elif isinstance(target, ast.Attribute) and getattr(target.value, "id", None) not in ("self", "cls"):
                if getattr(target.value, "id", None) in OWN_OBJECTS:
                    continue
                found["state" if target.attr.startswith("_stapo") else "assigned"].add(target.attr)
    return found


def _ledger_text() -> str:
    return "\n".join(f"{p.symbol} {p.action}" for p in all_patches())


def _named(name: str, text: str) -> bool:
    """Whether ``name`` occurs in ``text`` as a whole dotted name (``update_actor`` is not in ``_update_actor``)."""
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


INTEGRATION_FILES = list(_sources(INTEGRATION))
PACKAGE_FILES = list(_sources(PACKAGE, exclude=("cpu",)))


@pytest.mark.parametrize("path,tree", INTEGRATION_FILES, ids=lambda v: v.name if isinstance(v, Path) else "")
def test_every_wrapper_assignment_and_state_name_is_in_the_ledger(path, tree):
    symbols = {p.symbol.rsplit(".", 1)[-1] for p in all_patches()}
    text = _ledger_text()
    found = touched(tree)
    assert not found["wrapped"] - symbols, f"{path.name}: wrapped without a ledger entry"
    assert not {a for a in found["assigned"] if not _named(a, text)}, f"{path.name}: assigned"
    assert not {s for s in found["state"] if not _named(s, text)}, f"{path.name}: state kept on a verl object"


@pytest.mark.parametrize("path,tree", PACKAGE_FILES, ids=lambda v: str(v.relative_to(PACKAGE))
                         if isinstance(v, Path) else "")
def test_every_mock_patch_of_a_library_is_in_the_ledger(path, tree):
    text = _ledger_text()
    assert not {m for m in touched(tree)["mocked"] if not _named(m, text)}


def test_the_scan_finds_each_kind_of_touch():
    tree = ast.parse(
        "from unittest import mock\n"
        "_STATE = '_stapo_thing'\n"
        "def install(module, worker, engine, fn):\n"
        "    setattr(fn, _MARK, True)\n"
        "    module.new_function = fn\n"
        "    engine.optimizer_step = fn\n"
        "    worker._stapo_cache = 1\n"
        "    worker.__dict__[_STATE] = 2\n"
        "    worker.__dict__.setdefault('_stapo_cursor', 3)\n"
        "    cursor.rows = []\n"
        "    self.fine = 4\n"
        "    with mock.patch.object(ray, 'init'), mock.patch('os.getpid'):\n"
        "        pass\n")
    assert touched(tree) == {
        "wrapped": {"fn"},
        "assigned": {"new_function", "optimizer_step"},
        "state": {"_stapo_cache", "_stapo_thing", "_stapo_cursor"},
        "mocked": {"ray.init", "os.getpid"},
    }


def test_the_real_touches_are_found():
    # the instance overrides and the state kept on verl objects of verl 0.9.1's integration, by name
    found = {k: set() for k in ("wrapped", "assigned", "state", "mocked")}
    for _, tree in PACKAGE_FILES:
        for kind, names in touched(tree).items():
            found[kind] |= names
    assert {"update_actor", "optimizer_step", "policy_token_mask_fn", "validate_config", "run_ppo"} <= found["assigned"]
    assert {"_stapo_cursor", "_stapo_tokenizer", "_stapo_diagnostics"} <= found["state"]
    assert {"ray.init", "ray.is_initialized", "transfer_queue.init"} <= found["mocked"]
