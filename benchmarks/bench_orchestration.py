"""Where the tiny run's CPU goes, per process and per step, and its wall split, for one or more builds, interleaved.

Runs ``bash recipes/tiny_cpu_stapo.sh`` (the real ``main_ppo`` with the real workers) once per build and repetition,
in the order ``A B A B ...``, and while it runs reads every descendant process's CPU time (``utime + stime`` of
``/proc/PID/stat``) every ``--poll`` seconds. Each process is put in a kind by its command line (Ray names its workers
``ray::<class>``: the CPU rollout server, the FSDP actor ``WorkerDict``, the agent loop, TransferQueue's controller and
storage, the reward worker, the TaskRunner, the load balancer; Ray's own daemons; the launcher and the console). When
``metrics.jsonl`` gets a row (verl writes one per step, and one for the validation before training), the cumulative CPU
of each kind is snapshot, so a step's CPU is the difference between its row and the one before. A process's CPU since
its last poll before exiting is lost (at most ``--poll`` seconds of it).

Prints, per build: the median CPU-seconds per training step of each kind (steps without validation), with min-max over
the repetitions' medians; the median wall split of a step (``timing_s/step``, ``gen``, ``old_log_prob``,
``update_actor``); validation (``timing_s/testing``, which verl logs for the validations after a step, not for the one before
training), start-up with validation 0 (launch to the first row), the report (last row to exit), the total; and the
rollout server's padding rows per step (its ``[cpu rollout]`` log lines). ``--json`` writes every run's numbers.

Usage::

    python benchmarks/bench_orchestration.py --build after=. --build before=/path/to/other/checkout --reps 2 \\
        --out outputs/orchestration [hydra overrides ...]

A build is a checkout: its ``recipes/`` run with its own ``stapo_verl`` first on ``PYTHONPATH`` and this checkout's
``.venv`` (``STAPO_VENV``). Each run gets a fresh run directory under ``--out``. The machine's load (1-minute load
average) at each run's start and end is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (kind, regex on the command line), first match wins
KINDS = (
    ("rollout server", r"ray::CPURolloutServer"),
    ("actor", r"ray::WorkerDict"),
    ("agent loop", r"ray::AgentLoopWorker"),
    ("TransferQueue", r"ray::(TransferQueueController|SimpleStorageUnit)"),
    ("reward", r"ray::RewardLoopWorker"),
    ("TaskRunner", r"ray::TaskRunner"),
    ("load balancer", r"ray::GlobalRequestLoadBalancer"),
    ("launcher", r"stapo_verl\.launch\.train|verl\.trainer\.main_ppo"),
    ("console", r"stapo_verl\.launch\.console"),
    ("Ray", r"ray::|/ray/|raylet|gcs_server|ray\.util|dashboard"),
)
_TICK = os.sysconf("SC_CLK_TCK")
_PADDING = re.compile(r"\[cpu rollout\] before step \d+: (\d+) requests, (\d+) blocks, (\d+) of (\d+) rows padding")


def kind_of(cmdline: str) -> str:
    """The kind of a process by its command line (:data:`KINDS`), else ``"other"``."""
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    return "other"


def _proc_table() -> dict[int, tuple[int, float, str]]:
    """``{pid: (ppid, cpu_seconds, cmdline)}`` of every readable process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, cmd)
    return out


def run_once(build: Path, venv: Path, run_dir: Path, overrides: list[str], poll: float) -> dict:
    """One tiny run of ``build``; returns its per-row CPU snapshots by kind, timings and padding.

    Raises:
        RuntimeError: the run exited non-zero (the message names its log).
    """
    env = dict(os.environ, STAPO_RUN_DIR=str(run_dir), STAPO_VENV=str(venv),
               PYTHONPATH=os.pathsep.join([str(build)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    log = run_dir.with_suffix(".console")
    start, load0 = time.monotonic(), os.getloadavg()[0]
    with open(log, "w") as fh:
        proc = subprocess.Popen(["bash", "recipes/tiny_cpu_stapo.sh", *overrides], cwd=build, env=env, stdout=fh,
                                stderr=subprocess.STDOUT)
    ours: set[int] = {proc.pid}
    last: dict[int, float] = {}  # each process's CPU seconds at the previous poll
    acc: dict[str, float] = {}  # CPU seconds by kind; a process's kind is read at every poll (Ray renames workers)
    snapshots: list[tuple[float, dict[str, float]]] = []
    metrics = run_dir / "metrics.jsonl"
    rows = 0
    while True:
        done = proc.poll() is not None
        table = _proc_table()
        for pid, (ppid, secs, cmd) in sorted(table.items()):
            if pid not in ours and ppid in ours:
                ours.add(pid)
            if pid in ours:
                kind = kind_of(cmd) if pid != proc.pid else "launcher"
                acc[kind] = acc.get(kind, 0.0) + secs - last.get(pid, 0.0)
                last[pid] = secs
        n = sum(1 for _ in open(metrics)) if metrics.exists() else 0
        if n > rows or done:
            for _ in range(max(1, n - rows)):
                snapshots.append((time.monotonic() - start, dict(acc)))
            rows = n
        if done:
            break
        time.sleep(poll)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{build}: the tiny run exited {proc.returncode}; its output: {log}")
    records = [json.loads(line) for line in open(metrics)]
    text = (run_dir / "train.log").read_text(errors="replace")
    padding = [(int(m[0]), int(m[1]), int(m[2])) for m in _PADDING.findall(text)]
    return {"wall": wall, "load": (load0, os.getloadavg()[0]), "snapshots": snapshots,
            "rows": [r.get("data", r) for r in records], "padding": padding}


def summarise(run: dict) -> dict:
    """Per-step medians of CPU by kind (steps without validation), the wall split, and the phases around the steps.

    Args:
        run: :func:`run_once`'s result: ``snapshots`` ``[(seconds since launch, {kind: CPU-s})]``, one per
            ``metrics.jsonl`` row and one at exit; ``rows`` the rows' data; ``padding`` ``[(requests, blocks, dummy
            rows)]`` per weight update; ``wall``; ``load``.
    Returns:
        medians of ``cpu_per_step`` by kind and of the step's ``timing_s/*``; ``validation_total`` (the logged
        validations), ``start_up_val0`` (launch to the first row: start-up and the validation before training),
        ``steps_total``, ``report`` (last row to exit), ``wall``, ``padding_rows_per_step`` (median over the weight
        updates with fewer than 640 requests, i.e. without validation), ``val_acc``, ``load``.
    """
    rows, snaps = run["rows"], run["snapshots"]
    kinds = sorted({k for _, s in snaps for k in s})
    step_cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(1, min(len(rows), len(snaps))):
        if "timing_s/testing" in rows[i] or "timing_s/step" not in rows[i]:
            continue
        for k in kinds:
            step_cpu[k].append(snaps[i][1].get(k, 0.0) - snaps[i - 1][1].get(k, 0.0))
    steps = [r for r in rows if "timing_s/step" in r]
    med = lambda key: statistics.median([r.get(key, 0.0) for r in steps])  # noqa: E731
    val = sum(r.get("timing_s/testing", 0.0) for r in rows)
    first = snaps[0][0] if snaps else 0.0
    last = snaps[-2][0] if len(snaps) > 1 else 0.0  # the final snapshot is the exit
    train_pad = [p for n, _, p in run["padding"] if n < 640]
    return {
        "cpu_per_step": {k: statistics.median(v) for k, v in step_cpu.items() if v},
        "step": med("timing_s/step"), "gen": med("timing_s/gen"), "old_log_prob": med("timing_s/old_log_prob"),
        "update_actor": med("timing_s/update_actor"), "validation_total": val,
        "start_up_val0": first,
        "steps_total": sum(r["timing_s/step"] for r in steps), "report": run["wall"] - last, "wall": run["wall"],
        "padding_rows_per_step": statistics.median(train_pad) if train_pad else None,
        "val_acc": [r["val-core/math_dapo/acc/mean@1"] for r in rows if "val-core/math_dapo/acc/mean@1" in r],
        "load": run["load"],
    }


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    """Run the builds interleaved and print the table (module docstring). Returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", required=True, help="label=checkout (repeatable; the order runs)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", required=True, help="folder for the run directories")
    ap.add_argument("--poll", type=float, default=0.5)
    ap.add_argument("--json", help="write every run's summary here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    a = ap.parse_args(argv)
    builds = [(b.split("=", 1)[0], Path(b.split("=", 1)[1]).resolve()) for b in a.build]
    venv = Path(__file__).resolve().parents[1] / ".venv"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {label: [] for label, _ in builds}
    for rep in range(a.reps):
        for label, build in builds:
            run_dir = out / f"{label}{rep + 1}"
            s = summarise(run_once(build, venv, run_dir, a.overrides, a.poll))
            results[label].append(s)
            print(f"{label} #{rep + 1}: {s['wall']:.0f} s, step {s['step']:.2f} s (gen {s['gen']:.2f}), padding rows "
                  f"a step {s['padding_rows_per_step']}, val {s['val_acc']}, load {s['load'][0]:.1f}->"
                  f"{s['load'][1]:.1f}", flush=True)
    kinds = sorted({k for runs in results.values() for s in runs for k in s["cpu_per_step"]})
    print("CPU-s per training step (median over steps; median of runs, min-max):")
    for k in kinds + ["total"]:
        cells = []
        for label, _ in builds:
            vals = [sum(s["cpu_per_step"].values()) if k == "total" else s["cpu_per_step"].get(k, 0.0)
                    for s in results[label]]
            cells.append(f"{label} {_spread(vals)}")
        print(f"  {k:<15} " + "   ".join(cells))
    print("wall, s (median of runs, min-max):")
    for key in ("step", "gen", "old_log_prob", "update_actor", "steps_total", "validation_total", "start_up_val0",
                "report", "wall"):
        print(f"  {key:<17} " + "   ".join(f"{label} {_spread([s[key] for s in results[label]])}"
                                          for label, _ in builds))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
