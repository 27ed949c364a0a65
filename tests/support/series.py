"""The upstream series' version of a verl file, built from the installed verl 0.9.1's own file: the hunks of
``upstream/src/a.diff`` and ``b.diff`` applied with ``git apply --recount``, then the methods the series copies from
the plugin (``upstream/build_series.py``'s ``#@methods``). No network, no sdist."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def series_hunks(path: str) -> list[str]:
    """The sections of ``upstream/src/a.diff`` and ``b.diff`` (in series order) that patch ``path``."""
    out = []
    for key in ("a", "b"):
        text = (REPO / "upstream" / "src" / f"{key}.diff").read_text(encoding="utf-8")
        diff = text[text.index("diff --git "):]
        out += [s for s in re.split(r"(?m)^(?=diff --git )", diff) if s.startswith(f"diff --git a/{path} b/{path}")]
    assert out, f"no hunk of the series patches {path}"
    return out


def build_series():
    """``upstream/build_series.py`` as a module (what CI builds the series with)."""
    if "build_series" not in sys.modules:  # its dataclasses resolve their annotations through sys.modules
        spec = importlib.util.spec_from_file_location("build_series", REPO / "upstream" / "build_series.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["build_series"] = module
        spec.loader.exec_module(module)
    return sys.modules["build_series"]


def series_file(path: str, tmp: Path) -> Path:
    """The installed verl's ``path`` (e.g. ``verl/workers/engine_workers.py``) with the series applied, under ``tmp``."""
    import verl

    target = tmp / path
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(verl.__file__).parent.parent / path, target)
    for i, hunk in enumerate(series_hunks(path)):
        (tmp / f"{i}.diff").write_text(hunk, encoding="utf-8")
        subprocess.run(["git", "apply", "--recount", f"{i}.diff"], cwd=tmp, check=True, capture_output=True)
    build_series().expand_methods(target)
    return target


def load_series_module(path: str, tmp: Path):
    """:func:`series_file` loaded as ``<its package>._series_<name>`` (so its relative imports are the installed
    package's) and registered in ``sys.modules``. The names it imports from the series' other files
    (``apply_policy_token_mask``, ``run_prepare_batch`` in ``verl.workers.utils.losses``) must be there first: they
    are the plugin's, which the series copies."""
    target = series_file(path, tmp)
    name = ".".join([*Path(path).parent.parts, f"_series_{Path(path).stem}"])
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
