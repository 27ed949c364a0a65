"""Ray's local node gives its raylet a fixed 30 s to register with the GCS and raises a plain ``Exception`` when a
loaded machine takes longer (``ray._private.node.Node``); nothing has been trained then. The launcher recognises it
behind Hydra's ``SystemExit`` (the real ``@hydra.main`` below), ends the processes the failed start left, says so in
one line and starts main_ppo again; any other failure is not retried, and the attempts are bounded."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
from support.procs import child_env

from stapo_verl.launch import train

#: the message Ray 2.60 raises (``ray._private.node.Node.__init__``), verbatim
RAY_MESSAGE = ("The current node timed out during startup. This could happen because some of the raylet failed to "
               "startup or the GCS has become overloaded.")

ENTRY = '''
import os, subprocess, sys, time

def main():
    """Fails like a Ray start that timed out (leaving a 'raylet' behind) FAILS times, then trains."""
    state = os.environ["STATE_DIR"]
    n = len(os.listdir(state))
    if n < int(os.environ["FAILS"]):
        left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # a raylet writes to its own log files
        open(os.path.join(state, f"attempt{n}.pid"), "w").write(str(left.pid))
        try:
            raise Exception(os.environ["RAY_MESSAGE"] if os.environ["KIND"] == "ray" else "some other failure")
        except Exception:
            sys.exit(1)  # what @hydra.main does with a failed task (hydra._internal.utils.run_and_report)
    open(os.path.join(state, "trained"), "w").write("yes")
'''


def _launch(tmp_path, fails: int, kind: str = "ray"):
    (tmp_path / "stand_in_main.py").write_text(ENTRY)
    state = tmp_path / "state"
    state.mkdir()
    env = child_env(STAPO_MAIN_PPO="stand_in_main:main", PYTHONPATH=str(tmp_path), STATE_DIR=str(state),
                    FAILS=str(fails), KIND=kind, RAY_MESSAGE=RAY_MESSAGE)
    proc = subprocess.run([sys.executable, "-m", "stapo_verl.launch.train", "--run-dir", str(tmp_path / "run"),
                           "--", "trainer.total_training_steps=4", f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    left = [int(p.read_text()) for p in sorted(state.glob("attempt*.pid"))]
    return proc, state, left


def test_a_ray_start_timeout_ends_what_it_left_and_starts_again(tmp_path):
    proc, state, left = _launch(tmp_path, fails=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (state / "trained").read_text() == "yes" and len(left) == 2
    lines = [line for line in proc.stderr.splitlines() if "did not register" in line]
    assert [line.split("(")[-1] for line in lines] == ["2 of 3)", "3 of 3)"], proc.stderr[-3000:]
    assert all("ended the 1 process(es) it started" in line for line in lines)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in left)


def test_the_attempts_are_bounded_and_other_failures_are_not_retried(tmp_path):
    (tmp_path / "a").mkdir()
    proc, state, left = _launch(tmp_path / "a", fails=5)
    assert proc.returncode == 1 and len(left) == train.RAY_START_ATTEMPTS and not (state / "trained").exists()
    assert proc.stderr.count("did not register") == train.RAY_START_ATTEMPTS - 1
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in left)
    (tmp_path / "b").mkdir()
    proc, state, left = _launch(tmp_path / "b", fails=1, kind="other")
    assert proc.returncode == 1 and len(left) == 1 and "did not register" not in proc.stderr
    assert psutil.Process(left[0]).is_running()  # not a Ray start: the launcher leaves other processes alone
    psutil.Process(left[0]).kill()


def test_the_timeout_is_recognised_behind_the_real_hydra_main(tmp_path, monkeypatch):
    import hydra
    from hydra.core.global_hydra import GlobalHydra

    @hydra.main(version_base=None, config_path=str(tmp_path), config_name=None)  # no package here
    def task(_cfg):
        raise Exception(RAY_MESSAGE)

    monkeypatch.setattr(sys, "argv", ["task", f"hydra.run.dir={tmp_path}"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        task()
    GlobalHydra.instance().clear()
    assert exit_info.value.code == 1 and train.ray_start_timed_out(exit_info.value)
    assert not train.ray_start_timed_out(SystemExit(1))
    try:
        raise Exception("Ray " + RAY_MESSAGE)  # not Ray's message
    except Exception as other:
        assert not train.ray_start_timed_out(other)


def test_the_installed_ray_still_raises_the_message_the_launcher_matches():
    """The retry matches Ray's message text (Ray gives the timeout no exception type of its own): if a Ray upgrade
    rewords it or makes the 30 s configurable, this goes red and the launcher's match must follow."""
    import inspect

    import ray._private.node as node

    source = inspect.getsource(node.Node.__init__)
    assert train.RAY_START_TIMEOUT in source and RAY_MESSAGE.startswith(train.RAY_START_TIMEOUT)
    assert "raylet_start_wait_time_s = 30" in source
