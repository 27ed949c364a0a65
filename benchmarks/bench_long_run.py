"""Benchmark: does a long tiny run stay flat? Driver and worker memory (RSS) and step time, early and late.

Runs ``bash recipes/tiny_cpu_stapo.sh`` for ``--steps`` steps (default 200; the recipe's batch, no validation, no
checkpoint) and samples, every time ``metrics.jsonl`` gains a step, the resident memory
of each process of the job, grouped by role: the driver (the launcher and verl's ``TaskRunner``), the FSDP worker
(``WorkerDict``: actor, loss, the plugin's mask, statistics and token dump), the rollout server, the agent-loop and
reward workers. Step time is verl's ``timing_s/step``.

What it prints, for step ``--early`` (default 20, after warm-up) and the last step: RSS per role and its growth in
per cent, and the median step time of the 10 steps before each with its interquartile range. The leak this guards
against was reported to verl (https://github.com/volcengine/verl/issues/4002): a loss that keeps
``model_output`` alive across micro-batches grows the worker's memory every step; the plugin's copied ``ppo_loss``,
its token dump and the diagnostics' buffers must not bring it back. Growth ≤ 5 % after warm-up is the target.

Usage: ``python benchmarks/bench_long_run.py [--steps 200] [--early 20] [--out DIR] [hydra overrides ...]``
(not part of the test suite: about 20 minutes on 2 cores). Writes ``DIR/rss.jsonl`` (one line per step and role).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
ROLES = (("WorkerDict", "fsdp worker"), ("CPURolloutServer", "rollout server"), ("AgentLoopWorker", "agent loop"),
         ("RewardLoopWorker", "reward worker"), ("TaskRunner", "driver (TaskRunner)"))


def role_of(proc: psutil.Process) -> str | None:
    """The role of a process of the job (None for Ray's own daemons and helpers)."""
    try:
        cmd = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if not cmd:
        return None
    if cmd[0].startswith("ray::"):
        for name, role in ROLES:
            if cmd[0].startswith(f"ray::{name}"):
                return role
        return None
    if "stapo_verl.launch.train" in " ".join(cmd):
        return "driver (launcher)"
    return None


def sample(root: int) -> dict[str, float]:
    """RSS in MiB per role, summed over the role's processes."""
    out: dict[str, float] = defaultdict(float)
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    for p in procs:
        role = role_of(p)
        if role is None:
            continue
        try:
            out[role] += p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return dict(out)


def steps_in(path: Path) -> dict[int, dict]:
    """Rows of verl's file logger merged per step (a torn last line is skipped)."""
    out: dict[int, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            out.setdefault(row["step"], {}).update(row["data"])
    return out


def median_iqr(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:.2f} s (IQR {q[0]:.2f}-{q[2]:.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--early", type=int, default=20, help="the step after warm-up to compare with (default 20)")
    ap.add_argument("--out", default=None, help="run directory (default: a new temporary directory)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    if not 10 < a.early < a.steps:
        ap.error(f"--early={a.early}: must be > 10 and < --steps={a.steps}")
    run_dir = Path(a.out or tempfile.mkdtemp(prefix="stapo_long_"))
    cmd = ["bash", str(REPO / "recipes" / "tiny_cpu_stapo.sh"), f"trainer.total_training_steps={a.steps}",
           "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", *a.overrides]
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "bench_console.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "STAPO_RUN_DIR": str(run_dir)})
    rss: dict[int, dict[str, float]] = {}
    metrics_path = run_dir / "metrics.jsonl"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` runs the finally below too
    try:
        with open(run_dir / "rss.jsonl", "w") as out:
            while proc.poll() is None:
                done = [s for s in steps_in(metrics_path) if s > 0 and s not in rss]
                if done:
                    snap = sample(proc.pid)
                    for s in done:
                        rss[s] = snap
                        out.write(json.dumps({"step": s, "rss_mib": snap}) + "\n")
                    out.flush()
                time.sleep(0.5)
    finally:  # interrupted: take the job's whole process tree down with the benchmark
        if proc.poll() is None:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for p in tree:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
    if proc.returncode != 0:
        print(f"the run failed (exit {proc.returncode}); see {run_dir}/bench_console.log", file=sys.stderr)
        return 1
    m = steps_in(metrics_path)
    last = max(s for s in rss)
    print(f"{a.steps} tiny steps in {run_dir} (RSS sampled when each step's metrics row appeared)")
    print(f"{'role':22s} {'step ' + str(a.early):>12s} {'step ' + str(last):>12s} {'growth':>8s}")
    roles = sorted(set(rss[a.early]) | set(rss[last]))
    for role in roles:
        early, late = rss[a.early].get(role, float("nan")), rss[last].get(role, float("nan"))
        print(f"{role:22s} {early:10.1f} MiB {late:8.1f} MiB {100 * (late - early) / early:+7.1f} %")
    for step in (a.early, last):
        window = [m[s]["timing_s/step"] for s in range(step - 9, step + 1) if "timing_s/step" in m.get(s, {})]
        print(f"step time, steps {step - 9}-{step}: median {median_iqr(window)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
