"""Ray's raylet kills a worker that has not registered within ``worker_register_timeout_seconds`` (60 s by default),
and the driver of the node's first job waits for the workers prestarted for it, forever once one was killed: on a
starved machine a launch hung in ``ray.init``. The launcher gives the workers of the Ray node it starts
``train.RAY_WORKER_REGISTER_TIMEOUT_S`` instead. Here a worker is made slower to start than Ray's 60 s (a
``sitecustomize`` that sleeps in Ray's ``default_worker.py`` only), and the launch must still train."""

from __future__ import annotations

import subprocess
import sys

from support.procs import child_env, kill_tree

from stapo_verl.launch import train

#: longer than Ray's default registration limit (60 s), far below the launcher's
SLOW_START_S = 65

SITECUSTOMIZE = '''
import os, sys, time
if sys.argv and os.path.basename(sys.argv[0]) == "default_worker.py":  # Ray's worker processes only
    time.sleep(float(os.environ["SLOW_WORKER_START_S"]))
'''

ENTRY = '''
import os

def main():
    """What main_ppo does first: start a local Ray node (ray.init waits for the prestarted workers), run a task."""
    import ray

    @ray.remote
    def worker_pid():
        return os.getpid()

    ray.init(num_cpus=1, include_dashboard=False)
    pid = ray.get(worker_pid.remote())
    ray.shutdown()
    open(os.environ["TRAINED"], "w").write(str(pid))
'''


def _register_timeout_in_child(value: str | None) -> int:
    """``worker_register_timeout_seconds`` as Ray's config reads it in a fresh interpreter, with the variable set
    to ``value`` (None: unset)."""
    env = child_env()
    env.pop(train.RAY_WORKER_REGISTER_TIMEOUT_ENV, None)
    if value is not None:
        env[train.RAY_WORKER_REGISTER_TIMEOUT_ENV] = value
    code = "import ray._raylet as r; print(r.Config.worker_register_timeout_seconds())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    return int(out.stdout.split()[-1])


def test_the_installed_ray_reads_the_register_timeout_from_the_environment():
    """The gate of the launcher's setting: if a Ray upgrade renames the variable or changes its default, this goes
    red."""
    assert _register_timeout_in_child(None) == 60 < SLOW_START_S < train.RAY_WORKER_REGISTER_TIMEOUT_S
    assert _register_timeout_in_child("611") == 611


def test_a_worker_slower_to_start_than_rays_default_limit_does_not_hang_the_launch(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (site / "stand_in_main.py").write_text(ENTRY)
    env = child_env(STAPO_MAIN_PPO="stand_in_main:main", SLOW_WORKER_START_S=str(SLOW_START_S),
                    TRAINED=str(tmp_path / "trained"), RAY_AUTH_MODE="disabled", RAY_DISABLE_USAGE_STATS="1")
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    env.pop(train.RAY_WORKER_REGISTER_TIMEOUT_ENV, None)  # Ray's 60 s, unless the launcher sets it
    proc = subprocess.Popen([sys.executable, "-m", "stapo_verl.launch.train", "--run-dir", str(tmp_path / "run"),
                             "--", "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'ck'}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=SLOW_START_S + 420)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)  # the launcher, the Ray node it started and its workers
        _, err = proc.communicate()
        raise AssertionError(f"the launch hung in ray.init (no worker registered): {err[-2000:]}") from None
    assert proc.returncode == 0, err[-3000:]
    assert int((tmp_path / "trained").read_text()) not in (0, proc.pid)  # the task ran in a Ray worker
