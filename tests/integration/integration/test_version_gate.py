"""The version gate against a real other verl: the verl 0.9.0 wheel from PyPI, unpacked first on ``PYTHONPATH``.

``import verl`` (which loads the plugin through its entry point) and ``python -m verl.trainer.main_ppo`` must both
fail with the version error before anything else happens; importing the plugin module directly too. With
``STAPO_ALLOW_UNSUPPORTED_VERL=1`` the plugin loads with a loud warning.
"""

import subprocess
import sys
import zipfile

import pytest
from support.procs import child_env

MESSAGE = "stapo-verl 0.2.0 needs verl==0.9.1; found verl 0.9.0"


@pytest.fixture(scope="module")
def verl_090(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl090")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
                    "verl==0.9.0", "-d", str(root)], check=True, timeout=300)
    (wheel,) = root.glob("verl-0.9.0-*.whl")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root / "site")
    return root / "site"


def _run(args, site, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=child_env(PYTHONPATH=str(site), **env))


@pytest.mark.parametrize("args", [["-c", "import verl"], ["-c", "import stapo_verl.plugin"],
                                  ["-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
                                   "actor_rollout_ref.actor.policy_loss.loss_mode=stapo"]])
def test_other_verl_fails_loudly_before_anything_runs(verl_090, args):
    out = _run(args, verl_090)
    assert out.returncode != 0
    assert "IncompatibleVerlError" in out.stderr and MESSAGE in out.stderr, out.stderr[-2000:]
    assert "ray.init" not in out.stderr and "Started a local Ray instance" not in out.stdout + out.stderr


def test_override_loads_with_a_warning(verl_090):
    out = _run(["-c", "import verl, sys; print('stapo_verl.plugin' in sys.modules, verl.__version__)"], verl_090,
               STAPO_ALLOW_UNSUPPORTED_VERL="1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["True", "0.9.0"]
    assert MESSAGE in out.stderr and "Proceeding because STAPO_ALLOW_UNSUPPORTED_VERL=1" in out.stderr
