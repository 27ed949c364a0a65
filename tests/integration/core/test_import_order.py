"""Whatever stapo_verl module a process imports first, the plugin loads.

``import verl`` imports the plugin in the middle of verl's own ``__init__``; a stapo_verl module that imported verl
at its top, and that installing the plugin needs, would then be half-initialised, the plugin's import would fail,
and verl's loader would only log that at DEBUG level: the job would run without the plugin. This happened when a
pure module (``stapo_verl.diagnostics.stats``) imported a helper from :mod:`stapo_verl.core`. The job forks one
process per module the plugin loads (the list is read from a plain ``import verl``, so a new module is covered
without editing this test); each imports its module first, then ``import verl``. The pure packages (``algo``,
``diagnostics``) are checked to import neither verl nor :mod:`stapo_verl.core`, so a script may import them first.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.procs import REPO, child_env

JOB = Path(__file__).with_name("import_first_job.py")
#: modules that cannot be imported before verl, each with why; importing one first must fail loudly (an ERROR line
#: naming the cause), never silently
FIRST_IMPORT_FAILS = {
    # PlatformCPU subclasses verl's PlatformBase at module level, and registering the platform (inside import verl,
    # with VERL_PLATFORM=cpu) needs that class. Only the CPU backend's own code imports this module.
    "stapo_verl.cpu.platform": "cannot import name 'PlatformCPU' from partially initialized module",
}
#: what the plugin must load in a CPU process, at least (so the test cannot pass on an empty list)
MUST_COVER = {"stapo_verl.plugin", "stapo_verl.core.masks", "stapo_verl.integration.verl_0_9_1.driver_config",
              "stapo_verl.integration.verl_0_9_1.policy_loss", "stapo_verl.integration.verl_0_9_1.policy_loss.config",
              "stapo_verl.integration.verl_0_9_1.policy_loss.hydra_options", "stapo_verl.cpu",
              "stapo_verl.cpu.platform"}


def test_any_module_first_then_verl_loads_the_plugin():
    out = subprocess.run([sys.executable, str(JOB)], capture_output=True, text=True, timeout=900,
                         env=child_env(VERL_PLATFORM="cpu"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert MUST_COVER <= set(report["modules"]), sorted(MUST_COVER - set(report["modules"]))
    assert set(report["results"]) == set(report["modules"])
    wrong = {}
    for module, r in report["results"].items():
        if module in FIRST_IMPORT_FAILS:
            loud = [e for e in r["errors"] if "stapo-verl did not load" in e and FIRST_IMPORT_FAILS[module] in e
                    and "import verl first" in e]
            if r["plugin"] or not loud:
                wrong[module] = r
        elif not (r["plugin"] and r["validate_config"]) or r["errors"]:
            wrong[module] = r
    assert not wrong, json.dumps(wrong, indent=1)


#: the pure packages: importing every module of them imports neither verl nor stapo_verl.core
PURE_PACKAGES = ("stapo_verl/algo", "stapo_verl/diagnostics")


def test_pure_packages_import_neither_verl_nor_core():
    root = REPO
    modules = sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                     for pkg in PURE_PACKAGES for p in (root / pkg).glob("*.py"))
    assert "stapo_verl.algo.config_ranges" in modules and "stapo_verl.diagnostics.stats" in modules
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m == 'verl' or m.startswith(('verl.', "
            "'stapo_verl.core')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
