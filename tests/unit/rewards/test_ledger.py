"""The reward code's ledger (:mod:`stapo_verl.rewards.ledger`) lists exactly the sites the code patches, its
fingerprints match the installed sources, and its gate refuses a differing site naming the symbol.

The sites are found in the source (``ast``; nothing imported): an assignment, augmented assignment or ``del`` whose
target is an attribute of an imported module of the standard library, math-verify or pebble (at any depth: inside
functions too, with the imports of that function), ``setattr`` on one, and ``mock.patch`` / ``patch.object`` of one.
An attribute of a module-level instance (``multiprocessing.forkserver._forkserver._forkserver_alive_fd``) is reported
as state on its class's ``__init__``, the form of the other ledgers. Scanned: :mod:`stapo_verl.rewards`, and
:mod:`stapo_verl.launch` and :mod:`stapo_verl.eval`, which could patch the same packages (they patch none; their only
write, ``sys.argv``, is the interpreter's documented argument list: :data:`PUBLIC`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest

import stapo_verl
from stapo_verl.ledger import ALLOW_ENV, fingerprint, ledger_mismatches
from stapo_verl.rewards import ledger

PACKAGE = Path(stapo_verl.__file__).parent
SCANNED = ("rewards", "launch", "eval")
#: top-level packages whose sites the ledger covers
COVERED = frozenset(sys.stdlib_module_names) | {"math_verify", "pebble"}
#: writes that are a module's public, documented interface (not a patch), with the reason
PUBLIC = {
    "sys.argv": "the interpreter's argument list; stapo_verl.launch.train sets it for verl's @hydra.main to parse",
}
#: the CPython minor versions the standard-library fingerprints were compared on when the ledger was written
CHECKED_PYTHONS = ((3, 10), (3, 11), (3, 12), (3, 13))
_INSTANCE = re.compile(r"^\w+ = (\w+)\(…\)$")


def _aliases(nodes) -> dict[str, str]:
    """Local name → dotted module path, for the ``import`` statements among ``nodes``."""
    names = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    names[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _resolve(node: ast.AST, names: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        head = _resolve(node.value, names)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _targets(node: ast.AST, names: dict[str, str]) -> list[str]:
    """The dotted paths ``node`` writes, when it writes an attribute of an imported module."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple | ast.List) else [t])]
        return [p for t in flat if isinstance(t, ast.Attribute) and (p := _resolve(t, names))]
    if isinstance(node, ast.Call):
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = node.args
        if func == "setattr" and len(args) >= 2 and (obj := _resolve(args[0], names)) and (attr := _const(args[1])):
            return [f"{obj}.{attr}"]
        if func == "patch" and args and (dotted := _const(args[0])):
            return [dotted]
        if func == "object" and ast.unparse(node.func).endswith("patch.object") and len(args) >= 2 \
                and (obj := _resolve(args[0], names)) and (attr := _const(args[1])):
            return [f"{obj}.{attr}"]
    return []


def _site(path: str) -> tuple[str, str | None]:
    """``path``, or for an attribute of a module-level instance ``(<module>.<Class>.__init__, attribute)``."""
    owner, attr = path.rsplit(".", 1)
    signature, _ = fingerprint(owner)
    match = _INSTANCE.match(signature or "")
    if match and "." in owner:
        return f"{owner.rsplit('.', 1)[0]}.{match.group(1)}.__init__", attr
    return path, None


def patched_sites(sources: dict[str, str]) -> dict[str, set[str]]:
    """Every site of a covered package the sources change (module docstring): site → attributes kept on its
    instances (state sites)."""
    sites: dict[str, set[str]] = {}
    for source in sources.values():
        tree = ast.parse(source)
        module_names = _aliases(tree.body)
        scopes = [(tree, module_names)] + [
            (fn, {**module_names, **_aliases(ast.walk(fn))}) for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)]
        for scope, names in scopes:
            nodes = ast.walk(scope) if scope is not tree else (
                n for s in tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                for n in ast.walk(s))
            for node in nodes:
                for path in _targets(node, names):
                    if path.split(".")[0] not in COVERED or path in PUBLIC:
                        continue
                    site, attr = _site(path)
                    sites.setdefault(site, set()).update({attr} if attr else set())
    return sites


SOURCES = {str(p.relative_to(PACKAGE)): p.read_text(encoding="utf-8")
           for pkg in SCANNED for p in sorted((PACKAGE / pkg).rglob("*.py"))}
PATCHED = {e.symbol for e in ledger.PATCHES if not e.action.startswith("relied on")}


def test_the_ledger_lists_exactly_the_sites_the_code_patches():
    """Every site the code changes has a ledger entry, and every entry that is not 'relied on' is such a site."""
    found = patched_sites(SOURCES)
    assert sorted(set(found) - PATCHED) == [], f"patched but not in stapo_verl.rewards.ledger: {set(found) - PATCHED}"
    assert sorted(PATCHED - set(found)) == [], "in the ledger but not patched (or no longer found)"
    assert PATCHED == {"multiprocessing.spawn.prepare", "multiprocessing.forkserver.ForkServer.__init__",
                       "multiprocessing.resource_tracker.unregister", "math_verify.parser.TIMEOUT_WARNING_SHOWN",
                       "math_verify.grader.TIMEOUT_WARNING_SHOWN"}


def test_state_written_on_foreign_instances_is_named():
    """An attribute the code writes on another package's instance is named in the action of the class's entry."""
    by_symbol = {e.symbol: e for e in ledger.PATCHES}
    state = {s: attrs for s, attrs in patched_sites(SOURCES).items() if attrs}
    assert state == {"multiprocessing.forkserver.ForkServer.__init__": {"_forkserver_alive_fd"}}
    for symbol, attrs in state.items():
        assert all(a in by_symbol[symbol].action for a in attrs), by_symbol[symbol].action


def test_the_scanner_sees_a_new_patch():
    """A patch of a covered package, in any of the forms the scanner reads, is found; other writes are not."""
    sample = '''
import multiprocessing.spawn
import os.path as osp
import ray
from unittest import mock


def patch_all(obj):
    from multiprocessing import forkserver
    import math_verify.parser
    multiprocessing.spawn.prepare = None
    forkserver._forkserver._forkserver_pid = 1
    math_verify.parser.TIMEOUT_WARNING_SHOWN += 1
    setattr(osp, "join", None)
    mock.patch("pebble.pool.process.WORKERS_NAME", "x").start()
    mock.patch.object(ray, "init")
    obj.x = 1
    local = object()
    local.y = 2
    import sys
    sys.argv = ["x"]
    del multiprocessing.spawn.get_preparation_data


import stapo_verl.rewards.timeout as t
t.DEFAULT_TIMEOUT_S = 1
'''
    found = patched_sites({"sample": sample})
    assert sorted(found) == ["math_verify.parser.TIMEOUT_WARNING_SHOWN", "multiprocessing.forkserver.ForkServer.__init__",
                             "multiprocessing.spawn.get_preparation_data", "multiprocessing.spawn.prepare",
                             "os.path.join", "pebble.pool.process.WORKERS_NAME"]
    assert found["multiprocessing.forkserver.ForkServer.__init__"] == {"_forkserver_pid"}


def test_every_entry_is_complete():
    assert len(ledger.PATCHES) == len({e.symbol for e in ledger.PATCHES}) == 14
    assert all(e.why and e.upstream and e.remove_when and e.signature for e in ledger.PATCHES)
    assert {e.symbol.split(".")[0] for e in ledger.STDLIB_PATCHES} == {"multiprocessing"}
    assert {e.symbol.split(".")[0] for e in ledger.MATH_VERIFY_PATCHES} == {"math_verify"}
    assert {e.symbol.split(".")[0] for e in ledger.PEBBLE_PATCHES} == {"pebble"}


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info[:2] not in CHECKED_PYTHONS,
                    reason="the standard-library fingerprints were compared on CPython 3.10 to 3.13 only")
def test_the_stdlib_entries_match_the_running_python():
    """What the pool's gate checks holds for this interpreter's standard library (the ledger's docstring: the pinned
    bodies are identical in CPython 3.10 to 3.13)."""
    assert ledger_mismatches(ledger.STDLIB_PATCHES, ledger.STDLIB_WRITTEN_FOR) == []


def test_the_math_verify_and_pebble_entries_match_the_installed_packages():
    from importlib.metadata import version

    assert version("math-verify") == "0.9.0"  # setup.cfg pins it: a new release means re-reading the entries
    assert ledger_mismatches(ledger.MATH_VERIFY_PATCHES, ledger.MATH_VERIFY_WRITTEN_FOR) == []
    assert ledger_mismatches(ledger.PEBBLE_PATCHES, ledger.PEBBLE_WRITTEN_FOR) == []


def test_a_differing_site_is_refused_naming_the_symbol(monkeypatch):
    """The gate fails loudly, naming the symbol; a missing symbol and a differing body are named too; with
    STAPO_ALLOW_UNSUPPORTED_VERL=1 it warns instead."""
    entry = next(e for e in ledger.STDLIB_PATCHES if e.symbol == "multiprocessing.spawn.prepare")
    other = dataclasses.replace(entry, signature="(data, extra)")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ledger.IncompatibleRewardSiteError,
                       match=r"spawn\.prepare: signature '\(data\)', expected '\(data, extra\)'"):
        ledger.check([other], ledger.STDLIB_WRITTEN_FOR)
    gone = dataclasses.replace(entry, symbol="multiprocessing.spawn.gone")
    with pytest.raises(ledger.IncompatibleRewardSiteError, match=r"multiprocessing\.spawn\.gone: not found"):
        ledger.check([gone], ledger.STDLIB_WRITTEN_FOR)
    hashed = dataclasses.replace(entry, source_sha256="0" * 64)
    with pytest.raises(ledger.IncompatibleRewardSiteError, match=r"spawn\.prepare: source differs .*CPython 3\.11"):
        ledger.check([hashed], ledger.STDLIB_WRITTEN_FOR)
    assert issubclass(ledger.IncompatibleRewardSiteError, BaseException)
    assert not issubclass(ledger.IncompatibleRewardSiteError, Exception)
    monkeypatch.setenv(ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"spawn\.prepare"):
        ledger.check([other], ledger.STDLIB_WRITTEN_FOR)


def _refuse(patches, written_for):
    raise ledger.IncompatibleRewardSiteError(f"refused: {[p.symbol for p in patches]} ({written_for})")


def test_the_pool_checks_its_sites_before_it_starts(monkeypatch):
    """KillableRunner checks the multiprocessing and pebble entries before it starts a pool (no fork server is
    started when they differ)."""
    from stapo_verl.rewards import timeout

    started = []
    monkeypatch.setattr(ledger, "check", _refuse)
    monkeypatch.setattr(timeout, "_forkserver_context", lambda: started.append(1))
    with pytest.raises(ledger.IncompatibleRewardSiteError, match=r"multiprocessing\.spawn\.prepare.*pebble"):
        timeout.KillableRunner(timeout_s=1.0, max_workers=1).run(len, "abc")
    assert started == []


def test_math_verify_flags_are_set_only_after_the_check(monkeypatch):
    """equivalence checks the math-verify entries before it first sets the flags in a process, and not again."""
    import math_verify.grader
    import math_verify.parser

    from stapo_verl.rewards import equivalence

    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(ledger, "check", _refuse)
    with pytest.raises(ledger.IncompatibleRewardSiteError, match=r"math_verify\.parser\.TIMEOUT_WARNING_SHOWN"):
        equivalence.answers_equivalent("x^2", "y^2")
    assert math_verify.parser.TIMEOUT_WARNING_SHOWN is False
    checked = []
    monkeypatch.setattr(ledger, "check", lambda patches, written_for: checked.append(written_for))
    assert equivalence.answers_equivalent("\\frac{1}{2}", "x") is False
    assert equivalence.answers_equivalent("x+1", "1+x") is True
    assert checked == [ledger.MATH_VERIFY_WRITTEN_FOR]
    assert math_verify.parser.TIMEOUT_WARNING_SHOWN is True and math_verify.grader.TIMEOUT_WARNING_SHOWN is True
