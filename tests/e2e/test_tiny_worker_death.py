"""End to end: a Ray worker killed mid-run ends the job within 2 minutes, non-zero, and the console names it.

``kill -9`` of verl's trainer worker (``WorkerDict``, the FSDP actor) or of the rollout server
(``CPURolloutServer``) once step 1 is done, i.e. while step 2 generates. Without a rollout server the agent loop's
requests fail, verl's sync ReplayBuffer refuses the failed groups and raises; without the trainer worker the next
``ray.get`` raises ``ActorDiedError``. Either way the recipe must not hang on a poll, and the failed-run tail says
which actor died.
"""

from __future__ import annotations

import time

import psutil
import pytest
from support.runs import SMALL, metrics_by_step, recipe_process

from stapo_verl.launch.console import dead_actors


def _actor_pids(root: int, name: str) -> list[int]:
    out = []
    for p in psutil.Process(root).children(recursive=True):
        try:
            if p.cmdline() and p.cmdline()[0].startswith(f"ray::{name}"):
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("actor", ["CPURolloutServer", "WorkerDict"])
def test_killed_worker_ends_the_job_naming_it(tmp_path, actor):
    run_dir, log = tmp_path / "run", tmp_path / "console.log"
    proc = recipe_process("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=20",
                          "trainer.test_freq=-1", "trainer.save_freq=-1", log=log)
    try:
        deadline = time.monotonic() + 900
        while not ((run_dir / "metrics.jsonl").exists() and metrics_by_step(run_dir / "metrics.jsonl")):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "step 1 did not finish"
            time.sleep(0.5)
        pids = _actor_pids(proc.pid, actor)
        assert len(pids) == 1, pids
        psutil.Process(pids[0]).kill()
        killed_at = time.monotonic()
        rc = proc.wait(timeout=120)  # raises TimeoutExpired (the test fails) if the job hangs
        took = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            from support.procs import kill_tree

            kill_tree(proc.pid)
    assert rc != 0 and took < 120
    assert dead_actors(str(run_dir / "train.log"))[0] == actor
    assert f"[stapo] Ray actor(s) died during this run: {actor}" in log.read_text()
