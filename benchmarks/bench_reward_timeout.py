"""Killable reward workers: the pebble pool (``stapo_verl.rewards.timeout``) against the zygote fork server it
replaced (``stapo_verl/rewards/timeout.py`` at ``--old-ref``), measured interleaved in one run.

Usage (repository root)::

    python benchmarks/bench_reward_timeout.py [--rounds 5] [--old-ref 99f115e0...]

Each round runs one fresh process per implementation, in alternating order (so load drifts hit both alike); the
old implementation runs from ``git archive <old-ref>`` unpacked into a temporary directory (read-only git). Inside
each process, after the runner has started (start-up is not measured):

* **latency**: median of 300 sequential calls of a trivial function (``abs``), in ms;
* **respawn**: with one worker, a call that hangs in one long C call (``math.factorial(10**9)``) is killed at a 0.5 s
  timeout (CPU time now, wall-clock time before: the same for a call that has a core); then the
  time of the next trivial call, which needs the replacement worker, in ms (median of 5);
* **throughput**: 1,000 calls from 8 threads on 2 workers, 1 % of them hanging (killed at 1 s), the rest burning
  about 2 ms (``sum(range(100_000))``); wall seconds.

Prints, per metric, the median over rounds with its range (min–max) for each implementation, and new/old.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The last commit whose stapo_verl/rewards/timeout.py is the zygote fork server.
DEFAULT_OLD_REF = "99f115e050a8a5f7960b6125373989b5fa8d0e23"

TRIAL = r'''
import json, math, statistics, sys, threading, time
from stapo_verl.rewards.timeout import KillableRunner

def timed(fn):
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0

out = {}
runner = KillableRunner(timeout_s=30, max_workers=1)
runner.run(abs, 1)  # start-up, not measured
lat = [timed(lambda: runner.run(abs, -1)) for _ in range(300)]
out["latency_ms"] = 1000 * statistics.median(lat)
resp = []
for _ in range(5):
    res = runner.run(math.factorial, 10**9, timeout_s=0.5)
    assert res.timed_out, res
    resp.append(timed(lambda: runner.run(abs, -1)))
out["respawn_ms"] = 1000 * statistics.median(resp)
runner.close()

runner = KillableRunner(timeout_s=1.0, max_workers=2)
runner.run(abs, 1)
jobs = [(math.factorial, 10**9) if i % 100 == 50 else (sum, range(100_000)) for i in range(1000)]
lock, results = threading.Lock(), []
def work(part):
    for fn, arg in part:
        r = runner.run(fn, arg)
        with lock:
            results.append(r)
t0 = time.perf_counter()
threads = [threading.Thread(target=work, args=(jobs[k::8],)) for k in range(8)]
for t in threads: t.start()
for t in threads: t.join()
out["throughput_s"] = time.perf_counter() - t0
assert sum(r.timed_out for r in results) == 10 and sum(r.value == 4999950000 for r in results) == 990, \
    (sum(r.timed_out for r in results), sum(r.value == 4999950000 for r in results))
runner.close()
print("RESULT " + json.dumps(out))
'''


def _old_tree(ref: str, into: Path) -> Path:
    """``git archive ref stapo_verl`` unpacked under ``into``; returns that directory."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "stapo_verl"], check=True,
                             capture_output=True).stdout
    tar = into / "old.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as fh:
        fh.extractall(into / "old", filter="data")
    return into / "old"


def _trial(pythonpath: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    proc = subprocess.run([sys.executable, "-c", TRIAL], capture_output=True, text=True, env=env, timeout=900,
                          cwd=str(pythonpath))
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"trial with PYTHONPATH={pythonpath} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    """Run the interleaved rounds and print the table; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--old-ref", default=DEFAULT_OLD_REF, help="git commit holding the zygote implementation")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"old": _old_tree(args.old_ref, Path(tmp)), "new": REPO}
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for name in order:
                runs[name].append(_trial(trees[name]))
            print(f"round {r + 1}/{args.rounds}: " + "  ".join(
                f"{n}: " + ", ".join(f"{k}={v:.3f}" for k, v in runs[n][-1].items()) for n in ("old", "new")),
                flush=True)
    print(f"\n{'metric':<14} {'old median (min-max)':>26} {'new median (min-max)':>26} {'new/old':>8}")
    for key in ("latency_ms", "respawn_ms", "throughput_s"):
        vals = {n: [run[key] for run in runs[n]] for n in runs}
        med = {n: statistics.median(v) for n, v in vals.items()}
        cell = {n: f"{med[n]:.3f} ({min(vals[n]):.3f}-{max(vals[n]):.3f})" for n in vals}
        print(f"{key:<14} {cell['old']:>26} {cell['new']:>26} {med['new'] / med['old']:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
