"""benchmarks/bench_orchestration.py: processes by kind, per-step CPU from the snapshots, the wall split."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from support.bench_modules import benchmark_module

pytestmark = pytest.mark.unit


def test_kinds_follow_ray_process_names():
    with benchmark_module("bench_orchestration") as b:
        assert [b.kind_of(c) for c in (
            "ray::CPURolloutServer.generate", "ray::WorkerDict.actor_rollout_compute_log_prob",
            "ray::AgentLoopWorkerTQ", "ray::TransferQueueController", "ray::SimpleStorageUnit",
            "ray::RewardLoopWorker", "ray::TaskRunnerV1.run", "ray::GlobalRequestLoadBalancer", "ray::IDLE",
            "/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x",
            "/v/bin/python -m stapo_verl.launch.train --run-dir r", "/v/bin/python -m stapo_verl.launch.console",
            "bash recipes/tiny_cpu_stapo.sh")] == [
            "rollout server", "actor", "agent loop", "TransferQueue", "TransferQueue", "reward", "TaskRunner",
            "load balancer", "Ray", "Ray", "launcher", "console", "other"]


def test_a_step_is_the_cpu_between_its_row_and_the_one_before_and_validation_steps_are_left_out():
    """Rows: validation 0, steps 1-3 (step 2 with validation). Snapshot i is taken when row i appears; the last one at
    exit. CPU per step = difference of consecutive snapshots; the median over steps 1 and 3."""
    rows = [{"val-core/math_dapo/acc/mean@1": 0.5},  # verl logs no timing for the validation before training
            {"timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 2.0},
            {"timing_s/step": 30.0, "timing_s/gen": 7.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 2.0,
             "timing_s/testing": 20.0, "val-core/math_dapo/acc/mean@1": 0.7},
            {"timing_s/step": 12.0, "timing_s/gen": 8.0, "timing_s/old_log_prob": 3.0, "timing_s/update_actor": 4.0}]
    snaps = [(60.0, {"rollout server": 20.0, "actor": 5.0}), (70.0, {"rollout server": 24.0, "actor": 8.0}),
             (100.0, {"rollout server": 40.0, "actor": 11.0}), (112.0, {"rollout server": 46.0, "actor": 12.0}),
             (120.0, {"rollout server": 46.0, "actor": 12.0})]
    run = {"wall": 120.0, "load": (1.0, 2.0), "snapshots": snaps, "rows": rows,
           "padding": [(768, 25, 32), (128, 5, 32), (128, 4, 0), (128, 4, 0)]}
    with benchmark_module("bench_orchestration") as b:
        s = b.summarise(run)
    assert s["cpu_per_step"] == {"rollout server": 5.0, "actor": 2.0}  # medians of (4, 6) and (3, 1)
    assert (s["step"], s["gen"], s["old_log_prob"], s["update_actor"]) == (12.0, 7.0, 1.0, 2.0)
    assert (s["validation_total"], s["start_up_val0"], s["steps_total"], s["report"]) == (20.0, 60.0, 52.0, 8.0)
    assert s["padding_rows_per_step"] == 0 and s["val_acc"] == [0.5, 0.7]


def test_cpu_of_a_child_process_is_counted():
    """A busy child of this process shows its CPU seconds in the table (``/proc``), with its parent's pid."""
    with benchmark_module("bench_orchestration") as b:
        child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                                  "while time.process_time() - t < 0.5: pass\ntime.sleep(30)"])
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                ppid, secs, cmd = b._proc_table()[child.pid]
                if secs >= 0.5:
                    break
                time.sleep(0.1)
            assert ppid == os.getpid() and 0.5 <= secs < 5 and "process_time" in cmd
        finally:
            child.kill()
            child.wait()
