"""End to end: the tiny recipe on a Ray cluster started the way production clusters start — ``ray start --head`` on
one node, ``ray start --address=…`` on another (here: two Ray nodes on this machine, each with its own temp dir and
one virtual GPU), then the recipe with ``RAY_ADDRESS``, ``NNODES=2``, ``GPUS_PER_NODE=1`` (recipes/slurm/ does the
same on Slurm).

What it checks: verl places an FSDP worker on each node (DP = 2); the plugin is loaded in both, and the driver writes
each rank's token dump into the run directory (the two nodes have their own temp dirs: the rows travel with the
metrics), a file per rank, empty for a rank that silenced nothing; the S2T threshold τ_h is global over DP (every
rank's rows of a step carry the same τ_h, the logged one); the token tables reach the driver's TensorBoard with the
rows of the ranks that silenced; the job ends with exit 0 and leaves the cluster alive. Which steps and ranks silence
is a property of the trajectory (it differs by CPU type), so the checks are conditioned on what the metrics report. The
recipe starts no Ray of its own here, so everything a worker needs (``VERL_PLATFORM=cpu``, the trackers' paths, the
thread counts) must reach the second node through ``ray_init.runtime_env``, which this run depends on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support.procs import free_port, kill_tree
from support.runs import SMALL, failure_text, metrics_by_step, run_recipe
from support.trackers import event_accumulator, tables

PL = "actor_rollout_ref.actor.policy_loss"
RAY = str(Path(sys.executable).parent / "ray")


#: logical CPUs a node declares: verl's placement group takes 3 a node, and the TaskRunner, TransferQueue and reward
#: actors land wherever there is room; with 4 a node the second placement group could find none and wait forever
NODE_CPUS = 8


def _start_node(args: list[str], temp_dir: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={NODE_CPUS}",
                             "--num-gpus=1",
                             f"--temp-dir={temp_dir}", "--disable-usage-stats", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)


def _alive_nodes(address: str) -> int:
    code = ("import ray; ray.init(address=%r, logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()))") % address
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def _actor_log_count(temp_dir: str, class_name: str) -> int:
    """How many worker logs of a Ray node name ``class_name`` as their actor (Ray starts each actor's ``.out`` log
    with ``:actor_name:<class>``); the node's logs live under its own ``--temp-dir``."""
    logs = Path(temp_dir).glob("session_*/logs/worker-*.out")
    return sum(f":actor_name:{class_name}" in p.read_text(errors="replace")[:4096] for p in logs)


@pytest.fixture
def two_node_cluster():
    # short temp dirs: Ray's socket paths must stay under the OS limit of 107 characters
    dirs = [tempfile.mkdtemp(prefix="rh"), tempfile.mkdtemp(prefix="rw")]  # the system temp dir, not pytest's
    address = f"127.0.0.1:{free_port()}"
    nodes = [_start_node(["--head", f"--port={address.split(':')[1]}", "--include-dashboard=false"], dirs[0])]
    try:
        deadline = time.monotonic() + 120
        while _alive_nodes(address) < 1:
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(1)
        nodes.append(_start_node([f"--address={address}"], dirs[1]))
        while _alive_nodes(address) < 2:
            assert time.monotonic() < deadline, "the second Ray node did not join"
            time.sleep(1)
        yield address, dirs
    finally:
        for proc in nodes[::-1]:
            kill_tree(proc.pid)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def test_tiny_recipe_on_a_two_node_ray_cluster(tmp_path, two_node_cluster):
    (address, dirs), run_dir = two_node_cluster, tmp_path / "run"
    for attempt in (1, 2):
        shutil.rmtree(run_dir, ignore_errors=True)
        r = run_recipe("tiny_cpu_stapo.sh", run_dir, *SMALL, "trainer.total_training_steps=2", "trainer.test_freq=-1",
                       "trainer.save_freq=-1", f"{PL}.s2t_tau_p=0.9", f"{PL}.dump_every=1", timeout=900,
                       RAY_ADDRESS=address, NNODES="2", GPUS_PER_NODE="1")
        # verl's worker group probes a free MASTER_PORT and binds it only when torch.distributed starts; another
        # process on the machine (a parallel test, Ray's own workers) can take it in between: one more try, then fail
        if r.returncode == 0 or attempt == 2 or "EADDRINUSE" not in failure_text(run_dir, r):
            break
    assert r.returncode == 0, failure_text(run_dir, r)
    assert f"using the existing Ray cluster at RAY_ADDRESS={address}" in r.stderr + r.stdout

    # verl's colocated FSDP workers (WorkerDict actors) ran on both nodes, as many on each
    counts = [_actor_log_count(d, "WorkerDict") for d in dirs]
    assert counts[0] == counts[1] >= 1, counts
    m = metrics_by_step(run_dir / "metrics.jsonl")
    assert sorted(m) == [1, 2]
    # a file for each rank that trained, written at each step by the driver (empty while the rank silenced nothing)
    rows = {rank: [json.loads(x) for x in (run_dir / f"stapo_tokens.dp{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}
    assert sorted(p.name for p in run_dir.glob("stapo_tokens.dp*.jsonl")) == ["stapo_tokens.dp0.jsonl",
                                                                             "stapo_tokens.dp1.jsonl"]
    assert all(r["dp_rank"] == rank for rank in (0, 1) for r in rows[rank])
    silenced_steps = {s for s in m if m[s]["actor/stapo/num_masked"] > 0}
    for step in m:  # every silenced token of the DP group is in the dump (below the per-rank cap of 256 rows)
        n_sil = sum(r["kind"] == "silenced" for rank in (0, 1) for r in rows[rank] if r["step"] == step)
        assert n_sil == m[step]["actor/stapo/num_masked"], (step, n_sil)
    for step in silenced_steps:
        # both ranks applied the mask with the threshold of the whole DP group: the same τ_h, the logged one
        tau = {r["tau_h"] for rank in (0, 1) for r in rows[rank] if r["step"] == step}
        assert len(tau) == 1 and tau.pop() == pytest.approx(m[step]["actor/stapo/tau_h"]), (step, tau)
    found = tables(event_accumulator(run_dir), tau_p=0.9)
    assert set(found) == silenced_steps
    for step in found:  # the table of a step holds the rows of the ranks that dumped rows at that step
        assert {r["dp_rank"] for r in found[step]} == {str(rank) for rank in (0, 1)
                                                      if any(x["step"] == step for x in rows[rank])}
    assert _alive_nodes(address) == 2  # the job ended without taking the cluster down
