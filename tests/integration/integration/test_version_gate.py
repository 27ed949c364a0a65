"""The scoped version gate against a real other verl: the verl 0.9.0 wheel from PyPI, unpacked first on ``PYTHONPATH``.

The wheel (downloaded once with ``pip download --no-deps`` into ``~/.cache/stapo_verl/wheels``) carries its
``dist-info``, so ``importlib.metadata`` and ``verl.__version__`` report 0.9.0, while this environment's stapo-verl
(and its ``verl.plugins`` entry point) stays installed: exactly a shared environment where someone installed another
verl. Then:

* ``import verl`` works and logs one warning line naming both versions; nothing of verl is patched (every ledger
  symbol is verl's own), the CPU platform is not loaded, verl's own losses are looked up as usual;
* a job that asks for STAPO fails naming both versions and ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: the plugin's actor
  option when verl builds the config, the recipe's ``--dry-run`` at its plugin step, and ``loss_mode=stapo`` at the
  loss lookup;
* a job that does not ask for it (the JustRL recipe) passes verl's start-up (the dry-run) as on verl 0.9.1;
* with ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` the plugin loads anyway, with a loud warning.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.procs import REPO, child_env

import stapo_verl
from stapo_verl.integration.verl_0_9_1 import ALLOW_ENV, VERL_VERSION

OTHER = "0.9.0"
WHEELS = Path.home() / ".cache" / "stapo_verl" / "wheels"
#: what every message of the gate says
FOUND = f"stapo-verl {stapo_verl.__version__} is written for verl {VERL_VERSION}; found verl {OTHER}"
PL = "actor_rollout_ref.actor.policy_loss"

#: run in a child on verl 0.9.0: import verl, import every module of the ledger, report what is verl's own
PROBE = r"""
import importlib, importlib.metadata, json, sys
import verl
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from stapo_verl.integration.verl_0_9_1 import IncompatibleVerlError
from stapo_verl.integration.verl_0_9_1.opt_in_ledger import all_patches

def live(symbol):
    parts = symbol.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj
    return None

objs = {p.symbol: live(p.symbol) for p in all_patches()}
import verl.workers.engine_workers as ew
import verl.workers.utils.losses as losses
out = {
    "verl": verl.__version__, "metadata": importlib.metadata.version("verl"), "verl_file": verl.__file__,
    "plugin": "stapo_verl.plugin" in sys.modules, "cpu": "stapo_verl.cpu" in sys.modules,
    "found": sorted(s for s, o in objs.items() if o is not None),
    "marked": sorted(s for s, o in objs.items() if getattr(o, "__stapo_integration__", False)),
    "ppo_loss_is_verls": ew.ppo_loss is losses.ppo_loss,
    "vanilla": get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla,
    "stapo_loss": POLICY_LOSS_REGISTRY["stapo"].__name__,
}
for key, node in (
    ("config_error", {"_target_": "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig",
                      "loss_mode": "stapo"}),
    ("vanilla_config", {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": "vanilla"}),
):
    try:
        out[key] = type(omega_conf_to_dataclass(OmegaConf.create(node))).__name__
    except IncompatibleVerlError as e:
        out[key] = str(e)
try:
    get_policy_loss_fn("stapo")(None, None, None, None)
except IncompatibleVerlError as e:
    out["loss_error"] = str(e)
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def verl_090(tmp_path_factory) -> Path:
    """verl 0.9.0's wheel unpacked into a temporary directory (to go first on ``PYTHONPATH``)."""
    wheel = WHEELS / f"verl-{OTHER}-py3-none-any.whl"
    if not wheel.exists():
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                        f"verl=={OTHER}", "-d", str(WHEELS)], check=True, timeout=300)
    site = tmp_path_factory.mktemp("verl090") / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _run(args, site, timeout=600, **env):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=child_env(PYTHONPATH=str(site), **env))


def _gate_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if FOUND in line]


@pytest.fixture(scope="module")
def probe(verl_090):
    out = _run([sys.executable, "-c", PROBE], verl_090, VERL_PLATFORM="")
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):]), out.stderr


def test_wheel_is_verl_090_and_the_plugin_loads(probe, verl_090):
    result, _ = probe
    assert (result["verl"], result["metadata"]) == (OTHER, OTHER)
    assert Path(result["verl_file"]).parent.parent == verl_090
    assert result["plugin"]  # the entry point of this environment's stapo-verl was loaded by `import verl`


def test_import_verl_warns_once_and_patches_nothing(probe):
    result, stderr = probe
    (warning,) = _gate_lines(stderr)
    assert "the plugin stays inactive" in warning and f"{ALLOW_ENV}=1" in warning, warning
    # the ledgers' symbols (the masked job's and the options') that exist in verl 0.9.0 are verl's own: no wrapper
    assert len(result["found"]) >= 10, result["found"]
    assert result["marked"] == []
    assert result["ppo_loss_is_verls"] and result["vanilla"]
    assert not result["cpu"]


def test_cpu_platform_is_not_registered_either(verl_090):
    out = _run([sys.executable, "-c", "import sys, verl; print('CPU', 'stapo_verl.cpu' in sys.modules)"], verl_090,
               VERL_PLATFORM="cpu")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CPU False" in out.stdout
    assert len(_gate_lines(out.stderr)) == 1


def test_a_stapo_config_and_loss_fail_naming_both_versions(probe):
    result, _ = probe
    assert result["vanilla_config"] == "PolicyLossConfig"  # verl's own config builds as without the plugin
    assert result["config_error"].startswith(f"{PL}.loss_mode='stapo' needs stapo-verl's verl integration, which "
                                             f"is not loaded: {FOUND}. Install verl=={VERL_VERSION}")
    assert f"{ALLOW_ENV}=1" in result["config_error"]
    assert result["stapo_loss"] == "unsupported_verl_policy_loss"
    assert result["loss_error"].startswith(f"{PL}.loss_mode='stapo' needs")
    assert FOUND in result["loss_error"] and f"{ALLOW_ENV}=1" in result["loss_error"]


def test_stapo_recipe_dry_run_fails_naming_both_versions(verl_090):
    # the dry-run's plugin step runs the plugin's gate for the job: it fails there, before verl's start-up
    out = _run(["bash", "recipes/qwen3_8b_stapo.sh", "--dry-run"], verl_090)
    assert out.returncode == 1, (out.stdout + out.stderr)[-4000:]
    assert len(_gate_lines(out.stderr)) == 1, out.stderr[-3000:]  # the import warning
    lines = out.stdout.splitlines()
    # the first line on screen names both versions (a warning: the job's own steps decide whether it can start)
    assert lines[0].startswith(f"[stapo dry-run] WARN  verl version: verl {OTHER} is installed; "), lines[0]
    assert "the plugin stays inactive" in lines[0] and f"{ALLOW_ENV}=1" in lines[0], lines[0]
    fail = next(i for i, line in enumerate(lines) if line.startswith("[stapo dry-run] FAIL "))
    assert lines[fail] == "[stapo dry-run] FAIL  plugin import + entry point + verl version", lines[fail]
    assert "main_ppo.main" not in out.stdout  # nothing after the failing step ran
    error = lines[fail + 1]
    assert error.startswith("stapo_verl.integration.verl_0_9_1.IncompatibleVerlError: "
                            f"{PL}.loss_mode='stapo', token_mask='s2t' needs"), error
    assert FOUND in error and f"{ALLOW_ENV}=1" in error
    assert "[stapo dry-run] FAILED" in out.stdout


def test_a_job_without_stapo_passes_verls_start_up(verl_090):
    # the JustRL recipe is verl's vanilla loss: its dry-run runs verl's validate_config, run_ppo up to ray.init and
    # TaskRunnerV1.run up to transfer_queue.init on verl 0.9.0 with the plugin installed
    out = _run(["bash", "recipes/run.sh", "8b", "justrl", "--dry-run"], verl_090)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "PASS  loss mode registered: loss_mode 'vanilla' registered" in out.stdout + out.stderr
    assert len(_gate_lines(out.stderr)) == 1
    assert out.stdout.splitlines()[0].startswith(f"[stapo dry-run] WARN  verl version: verl {OTHER} is installed")


def test_tiny_cpu_dry_run_fails_at_the_plugin_step_naming_both_versions(verl_090):
    # the tiny recipe runs loss_mode=stapo on the plugin's CPU platform, neither of which another verl ever loads
    out = _run(["bash", "recipes/run.sh", "tiny", "stapo", "--dry-run"], verl_090)
    assert out.returncode == 1, (out.stdout + out.stderr)[-4000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"[stapo dry-run] WARN  verl version: verl {OTHER} is installed"), lines[0]
    fail = next(i for i, line in enumerate(lines) if line.startswith("[stapo dry-run] FAIL "))
    assert lines[fail] == "[stapo dry-run] FAIL  plugin import + entry point + verl version", lines[fail]
    assert FOUND in lines[fail + 1] and f"{ALLOW_ENV}=1" in lines[fail + 1], lines[fail + 1]


def test_override_loads_anyway_with_a_loud_warning(verl_090):
    code = ("import sys, verl, verl.utils.config as c; "
            "print('LOADED', 'stapo_verl.plugin' in sys.modules, getattr(c.validate_config, '__stapo_integration__', "
            "False), verl.__version__)")
    out = _run([sys.executable, "-c", code], verl_090, **{ALLOW_ENV: "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LOADED True True 0.9.0" in out.stdout
    assert any(f"Loading it anyway because {ALLOW_ENV}=1, at your own risk" in line for line in _gate_lines(out.stderr))
