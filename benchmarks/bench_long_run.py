"""Benchmark: does a long tiny run stay flat? Driver and worker memory (RSS) and step time, early and late.

Runs ``bash recipes/tiny_cpu_stapo.sh`` for ``--steps`` steps (default 200; the recipe's batch, no validation, no
checkpoint) and samples, every time ``metrics.jsonl`` gains a step, the resident memory of each process of the job
(all of it, and split into private and shared pages), grouped by role: the driver (the launcher and verl's
``TaskRunner``), the FSDP worker (``WorkerDict``: actor, loss, the plugin's mask, statistics and token dump), the
rollout server, the agent-loop and reward workers. Step time is verl's ``timing_s/step``.

What it prints, for step ``--early`` (default 20, after warm-up) and the last step: each kind of resident memory
per role and its growth in per cent, and the median step time of the 10 steps before each with its interquartile
range. The leak this guards against was reported to verl (https://github.com/volcengine/verl/issues/4002): a loss
that keeps ``model_output`` alive across micro-batches grows the worker's memory every step; the plugin's copied
``ppo_loss``, its token dump and the diagnostics' buffers must not bring it back. Growth ≤ 5 % after warm-up is the
target.

Usage: ``python benchmarks/bench_long_run.py [--steps 200] [--early 20] [--out DIR] [hydra overrides ...]``
(not part of the test suite: about 30 minutes on 2 idle cores). Writes ``DIR/rss.jsonl`` (one line per step: MiB
per kind and role).
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


KINDS = ("rss", "anon", "shared")


def memory_of(pid: int) -> dict[str, float]:
    """One process's resident memory in MiB: ``rss`` (all), ``anon`` (its private heap and stacks: Linux's
    ``RssAnon``) and ``shared`` (file and shared-memory pages it has touched: ``RssFile`` + ``RssShmem``, which
    include the pages of Ray's object store the process has read from; they are not private memory)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            fields[key] = int(value.split()[0]) / 1024
    return {"rss": fields["VmRSS"], "anon": fields["RssAnon"], "shared": fields["RssFile"] + fields["RssShmem"]}


def sample(root: int) -> dict[str, dict[str, float]]:
    """Memory in MiB per kind (:data:`KINDS`) and role, summed over the role's processes."""
    out: dict[str, dict[str, float]] = {k: defaultdict(float) for k in KINDS}
    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    for p in procs:
        role = role_of(p)
        if role is None:
            continue
        try:
            mem = memory_of(p.pid)
        except (FileNotFoundError, ProcessLookupError):
            continue
        for k in KINDS:
            out[k][role] += mem[k]
    return {k: dict(v) for k, v in out.items()}


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
                        out.write(json.dumps({"step": s, **{f"{k}_mib": v for k, v in snap.items()}}) + "\n")
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
    print(f"{'role':22s} {'kind':6s} {'step ' + str(a.early):>12s} {'step ' + str(last):>12s} {'growth':>8s}")
    for role in sorted(set(rss[a.early]["rss"]) | set(rss[last]["rss"])):
        for kind in KINDS:
            early = rss[a.early][kind].get(role, float("nan"))
            late = rss[last][kind].get(role, float("nan"))
            print(f"{role:22s} {kind:6s} {early:8.1f} MiB {late:8.1f} MiB {100 * (late - early) / early:+7.1f} %")
    for step in (a.early, last):
        window = [m[s]["timing_s/step"] for s in range(step - 9, step + 1) if "timing_s/step" in m.get(s, {})]
        print(f"step time, steps {step - 9}-{step}: median {median_iqr(window)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
