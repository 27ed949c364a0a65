"""A SIGINT or SIGTERM to the launcher (``python -m stapo_verl.launch.train``) is a stop, not a crash: the checkpoint
folder the stop interrupted is removed, the complete one stays, one line says where it is and that the same command
resumes, no traceback, exit 128 + the signal's number. The training entry is a stand-in (``$STAPO_MAIN_PPO``) that
saves checkpoint 1, starts checkpoint 2 and receives the signal in the middle of it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support.procs import child_env

ENTRY = '''
import os, signal, sys, time

def main():
    base = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.default_local_dir="))
    os.makedirs(os.path.join(base, "global_step_1", "actor"))
    open(os.path.join(base, "latest_checkpointed_iteration.txt"), "w").write("1")
    os.makedirs(os.path.join(base, "global_step_2", "actor"))  # a save the signal interrupts
    open(os.path.join(base, "global_step_2", "actor", "model.pt"), "wb").write(b"half")
    os.kill(os.getpid(), getattr(signal, os.environ["STOP_SIGNAL"]))
    time.sleep(60)
    raise SystemExit("not stopped")
'''


@pytest.mark.parametrize("sig, rc", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_stop_signal_leaves_the_last_complete_checkpoint_and_says_how_to_resume(tmp_path, sig, rc):
    (tmp_path / "stand_in_main.py").write_text(ENTRY)
    ckpt, run = tmp_path / "ckpt", tmp_path / "run"
    env = child_env(STAPO_MAIN_PPO="stand_in_main:main", STOP_SIGNAL=sig, PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "stapo_verl.launch.train", "--run-dir", str(run), "--command",
                           "bash recipes/tiny_cpu_stapo.sh", "--", "trainer.total_training_steps=4",
                           f"trainer.default_local_dir={ckpt}"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == rc == 128 + getattr(signal, sig), proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (f"[stapo recipe] stopped by {sig}; the last complete checkpoint is {ckpt}/global_step_1 (step 1); "
                    "the same command resumes from it: bash recipes/tiny_cpu_stapo.sh")
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_1", "latest_checkpointed_iteration.txt"]


def test_after_stop_does_the_same_when_the_launcher_ended_first(tmp_path):
    """``--after-stop SIGTERM`` (what the recipe runs when Ray's processes, signalled too, ended the launcher before
    it could report): the same cleanup and the same line, from the composed config."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_3" / "actor").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    (ckpt / "global_step_4").mkdir()
    proc = subprocess.run([sys.executable, "-m", "stapo_verl.launch.train", "--run-dir", str(tmp_path / "run"),
                           "--command", "bash recipes/tiny_cpu_stapo.sh", "--after-stop", "SIGTERM", "--",
                           "trainer.total_training_steps=4", f"trainer.default_local_dir={ckpt}"],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines() == [(
        f"[stapo recipe] stopped by SIGTERM; the last complete checkpoint is {ckpt}/global_step_3 (step 3); the same "
        "command resumes from it: bash recipes/tiny_cpu_stapo.sh")]
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_3", "latest_checkpointed_iteration.txt"]


RESUMABLE_ENTRY = '''
import os, signal, sys

def main():
    base = next(a.split("=", 1)[1].strip("'") for a in sys.argv if a.startswith("trainer.default_local_dir="))
    with open(os.environ["ARGV_OUT"], "a") as f:
        f.write(repr(sys.argv[1:]) + "\\n")
    if not os.path.exists(os.path.join(base, "latest_checkpointed_iteration.txt")):
        os.makedirs(os.path.join(base, "global_step_1", "actor"))
        open(os.path.join(base, "latest_checkpointed_iteration.txt"), "w").write("1")
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit("not stopped")
'''


def test_the_resume_hint_run_literally_resumes_the_same_run(tmp_path):
    """The tiny recipe stopped by SIGTERM after checkpoint 1 prints a command; that command, run as it is in a shell
    without the first run's environment, resumes the same run directory (verl's steps 2-4) with the same overrides,
    not a new run in outputs/."""
    import ast

    from support.recipes import BASE_ENV
    from support.procs import REPO

    (tmp_path / "stand_in_main.py").write_text(RESUMABLE_ENTRY)
    run = tmp_path / "run dir"
    harness = {"STAPO_MAIN_PPO": "stand_in_main:main", "PYTHONPATH": str(tmp_path),
               "ARGV_OUT": str(tmp_path / "argv")}
    overrides = ["trainer.total_training_steps=4", "actor_rollout_ref.actor.optim.lr=2e-6"]
    first = subprocess.run(["bash", "recipes/tiny_cpu_stapo.sh", *overrides], cwd=REPO,
                           env={**BASE_ENV, **harness, "STAPO_RUN_DIR": str(run), "TEST_FREQ": "2"},
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 143, first.stdout[-3000:] + first.stderr[-3000:]
    (line,) = [x for x in first.stdout.splitlines() if "the same command resumes from it: " in x]
    command = line.split("the same command resumes from it: ", 1)[1]
    assert "STAPO_RUN_DIR=" in command and "TEST_FREQ=2" in command and overrides[1] in command

    again = subprocess.run(["bash", "-c", command], cwd=REPO, env={**BASE_ENV, **harness},
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"[stapo recipe] training {run} (steps 2-4)" in again.stdout, again.stdout[-3000:]
    argvs = [ast.literal_eval(x) for x in (tmp_path / "argv").read_text().splitlines()]
    assert len(argvs) == 2 and argvs[0] == argvs[1]  # the same overrides, the same run directory
    assert overrides[1] in argvs[1] and "trainer.test_freq=2" in argvs[1]
