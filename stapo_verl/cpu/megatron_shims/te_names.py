"""The Transformer Engine names Megatron-Bridge 0.5.1's import touches, visible to the modules that touch them only.

Megatron-Bridge imports Transformer Engine unguarded in two modules of its import chain
(``megatron/bridge/peft/lora_layers.py``: ``import transformer_engine.pytorch as te`` and ``class
TELinearAdapter(te.Linear)``, a return annotation naming ``te.ops.Sequential``; ``megatron/bridge/peft/lora.py``:
the same import, used in function bodies only). PyPI's Transformer Engine cannot run without CUDA. A
``transformer_engine`` package importable by everyone is not an answer: Megatron-Core (``megatron/core/extensions/
transformer_engine.py``, ``gpt_layer_specs.py``, …) and modelopt (``modelopt/torch/quantization/plugins``) decide
that Transformer Engine is present when its import succeeds, and then take its code paths.

So :class:`TENamesFinder` (a :data:`sys.meta_path` finder) wraps the loader of exactly those modules
(:data:`IMPORTERS`): while one of them executes, and only then, ``transformer_engine`` and
``transformer_engine.pytorch`` in :data:`sys.modules` are stand-ins holding the names of :data:`NAMES`; afterwards
they are removed again. Every stand-in class refuses to be built, so nothing the route computes runs through one:
``isinstance(m, te.Linear)`` is False for every module, as it is for a model without Transformer Engine layers. A
module that is first imported during such a window and binds a stand-in (it would have decided that Transformer
Engine is present) is an error naming it (:class:`~stapo_verl.cpu.ledger.IncompatibleSiteError`), as is a name of
the stand-ins that an importer reads and :data:`NAMES` lacks.

Installed by :func:`stapo_verl.cpu.megatron_shims.install_hooks` (``VERL_PLATFORM=cpu`` processes); inert where a
real ``transformer_engine`` is importable. Ledger: :data:`stapo_verl.cpu.ledger.BRIDGE_PATCHES`.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from types import MappingProxyType

#: the Megatron-Bridge modules that import Transformer Engine unguarded at import time
IMPORTERS = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")
#: what they read from it at import time: module → names (``ops`` is a namespace of its own)
NAMES = MappingProxyType({
    "transformer_engine.pytorch": ("Linear", "LayerNormLinear", "ops"),
    "transformer_engine.pytorch.ops": ("Sequential",),
})
_STAND_IN = "_stapo_cpu_te_stand_in"


class TransformerEngineAbsent(RuntimeError):
    """A stand-in of a Transformer Engine name was used for something other than naming it."""


def _stand_in_class(qualname: str) -> type:
    def __init__(self, *args, **kwargs):
        raise TransformerEngineAbsent(
            f"{qualname} is the CPU platform's stand-in for a Transformer Engine name that Megatron-Bridge's import "
            "reads; Transformer Engine does not run on the CPU, and the CPU route builds no TE layer "
            "(stapo_verl.cpu.megatron_shims.te_names)")

    cls = type(qualname.rsplit(".", 1)[1], (), {"__init__": __init__, _STAND_IN: True,
                                                 "__module__": qualname.rsplit(".", 1)[0]})
    return cls


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        from stapo_verl.cpu.ledger import IncompatibleSiteError

        raise IncompatibleSiteError(
            f"{self.__name__}.{name}: read by a Megatron-Bridge module at import, but the CPU platform's Transformer "
            f"Engine stand-in holds only {dict(NAMES)} (stapo_verl.cpu.megatron_shims.te_names.NAMES): Megatron-Bridge "
            "differs from 0.5.1; add the name there if it is only named, not computed with")


def stand_in_modules() -> dict[str, types.ModuleType]:
    """Fresh stand-in modules ``transformer_engine``, ``transformer_engine.pytorch`` and its ``ops``, holding
    :data:`NAMES` (classes that raise :class:`TransformerEngineAbsent` when built)."""
    mods = {name: _StandInModule(name) for name in ("transformer_engine", *NAMES)}
    for modname, names in NAMES.items():
        for name in names:
            sub = f"{modname}.{name}"
            setattr(mods[modname], name, mods[sub] if sub in mods else _stand_in_class(sub))
    mods["transformer_engine"].pytorch = mods["transformer_engine.pytorch"]
    return mods


def is_stand_in(obj) -> bool:
    """Whether ``obj`` is one of the stand-in modules or classes."""
    return isinstance(obj, _StandInModule) or (isinstance(obj, type) and obj.__dict__.get(_STAND_IN, False) is True)


@contextlib.contextmanager
def _visible(importer: str):
    from stapo_verl.cpu.ledger import IncompatibleSiteError

    present = [k for k in sys.modules if k == "transformer_engine" or k.startswith("transformer_engine.")]
    if present:
        raise IncompatibleSiteError(f"{importer}: {present} already imported; the Transformer Engine stand-in is "
                                    "only for a process without Transformer Engine")
    before = set(sys.modules)
    sys.modules.update(stand_in_modules())
    try:
        yield
    finally:
        for name in ("transformer_engine", *NAMES):
            sys.modules.pop(name, None)
    for name in sorted(set(sys.modules) - before - {importer}):
        mod = sys.modules.get(name)
        bound = [k for k, v in vars(mod).items() if is_stand_in(v)] if mod is not None else []
        if bound:
            raise IncompatibleSiteError(
                f"{name} was first imported while {importer} ran with the Transformer Engine stand-in visible and "
                f"bound it ({bound}): it would take Transformer Engine's code paths. Import it before "
                f"{importer} (stapo_verl.cpu.megatron_shims.te_names)")


class _Loader(importlib.abc.Loader):
    def __init__(self, real: importlib.abc.Loader, name: str):
        self._real, self._name = real, name

    def create_module(self, spec):
        return self._real.create_module(spec)

    def exec_module(self, module):
        with _visible(self._name):
            self._real.exec_module(module)


class TENamesFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`IMPORTERS` as the path finder would and runs them with the stand-ins visible."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in IMPORTERS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


def install() -> None:
    """Put :class:`TENamesFinder` first on :data:`sys.meta_path` (idempotent); nothing where Transformer Engine
    itself is importable (the GPU image)."""
    if any(isinstance(f, TENamesFinder) for f in sys.meta_path):
        return
    if "transformer_engine" not in sys.modules and importlib.util.find_spec("transformer_engine") is not None:
        return
    sys.meta_path.insert(0, TENamesFinder())
