"""The Transformer Engine stand-in (:mod:`stapo_verl.cpu.megatron_shims.te_names`): visible to the listed importers
while they execute, and to nothing else; its classes refuse to be built; an unknown name or a module that would
detect Transformer Engine in the window is refused by name. Fake importer modules in a temporary directory play
Megatron-Bridge's (this environment has no Transformer Engine, as the CPU platform's)."""

from __future__ import annotations

import importlib
import sys

import pytest

from stapo_verl.cpu.ledger import IncompatibleSiteError
from stapo_verl.cpu.megatron_shims import te_names

IMPORTER = '''
import transformer_engine.pytorch as te


class TELinearAdapter(te.Linear):
    pass


def fused(self) -> tuple[te.ops.Sequential, te.ops.Sequential]:
    return None
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write ``{name: source}`` as top-level modules on sys.path, with the finder installed for ``importers``."""
    assert importlib.util.find_spec("transformer_engine") is None  # the platform's premise
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = te_names.TENamesFinder()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    written = []

    def write(importers: tuple[str, ...], **sources: str):
        monkeypatch.setattr(te_names, "IMPORTERS", importers)
        for name, source in sources.items():
            (tmp_path / f"{name}.py").write_text(source)
            written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_the_importer_sees_the_names_and_no_one_else_does(modules):
    modules(("fake_lora_layers",), fake_lora_layers=IMPORTER)
    mod = importlib.import_module("fake_lora_layers")
    assert mod.TELinearAdapter.__mro__[1].__name__ == "Linear" and te_names.is_stand_in(mod.te)
    assert not [k for k in sys.modules if k.split(".")[0] == "transformer_engine"]
    with pytest.raises(ImportError):  # Megatron-Core's `try: import transformer_engine` still fails
        importlib.import_module("transformer_engine")
    with pytest.raises(te_names.TransformerEngineAbsent, match="stand-in"):
        mod.te.Linear(4, 4)
    assert not isinstance(object(), mod.te.Linear)


def test_a_module_that_binds_te_in_the_window_is_refused_by_name(modules):
    detector = "try:\n    import transformer_engine\n    HAVE_TE = True\nexcept ImportError:\n    HAVE_TE = False\n"
    modules(("fake_importer",), fake_detector=detector,
            fake_importer="import transformer_engine.pytorch as te\nimport fake_detector\n")
    with pytest.raises(IncompatibleSiteError, match=r"fake_detector was first imported .*\['transformer_engine'\]"):
        importlib.import_module("fake_importer")
    sys.modules.pop("fake_detector", None)
    assert importlib.import_module("fake_detector").HAVE_TE is False  # imported outside the window: no TE


def test_a_name_the_stand_in_lacks_is_refused_by_name(modules):
    modules(("fake_importer",), fake_importer="import transformer_engine.pytorch as te\nX = te.TransformerLayer\n")
    with pytest.raises(IncompatibleSiteError, match=r"transformer_engine\.pytorch\.TransformerLayer"):
        importlib.import_module("fake_importer")
    assert "transformer_engine" not in sys.modules


def test_other_modules_are_left_to_the_path_finder(modules):
    modules(("fake_importer",), fake_other="import math\n")
    assert te_names.TENamesFinder().find_spec("fake_other", None) is None
    assert importlib.import_module("fake_other").math.pi > 3
