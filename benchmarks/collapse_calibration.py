"""Benchmark: the collapse early-warning's false alarms on healthy runs and its lead on failing ones.

Replays :class:`stapo_verl.diagnostics.collapse.CollapseMonitor` (what the trainer runs each step) over kept per-step
metrics, for a grid of settings (warm-up, threshold, log scale; window 20), and prints per setting:

* **false alarms per 100 healthy steps**: warning lines on the runs that did not fail (every step after the first) —
  the runs of the instability testbed (``benchmarks/results/instability/<candidate>/*.json``) its own failure
  criterion (:func:`instability_testbed.instability`) calls healthy, plus the ``metrics.jsonl`` files given with
  ``--healthy`` (e.g. a default tiny run, ``outputs/tiny_cpu_stapo/metrics.jsonl``);
* on the testbed's failing runs: how many were warned at or before the onset (the pre-registered criterion's first
  step) and not more than ``--lead-window`` steps before it, the median lead in steps, and the warnings more than
  ``--lead-window`` steps before the onset (too early to count as a lead).

Usage::

    python benchmarks/collapse_calibration.py [--candidate lr4e-4] [--healthy RUN/metrics.jsonl ...]

Signals: ``actor/entropy`` and ``actor/stapo/lm_head_grad_norm`` (what the testbed kept; the total gradient norm warns
only without the LM-head norm). Prints a table; nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from stapo_verl.diagnostics.collapse import CollapseMonitor  # noqa: E402

SIGNALS = ("actor/entropy", "actor/stapo/lm_head_grad_norm")
#: the signals of a default tiny run (``bash recipes/tiny_cpu_stapo.sh``, 20 steps) kept from its ``metrics.jsonl``
#: (``actor/entropy``, ``actor/stapo/lm_head_grad_norm``, the validation accuracy); where it ran: its first row's
#: ``"cpu"`` entry
TINY_HEALTHY = REPO / "benchmarks" / "results" / "collapse" / "tiny_cpu_stapo_default.metrics.jsonl"
#: (warm-up, threshold, log scale) tried; window 20 throughout (the default)
GRID = [(w, t, log) for log in (False, True) for w in (5, 10) for t in (4.0, 5.0, 6.0)]


def alarms(metrics: dict[int, dict], warmup: int, threshold: float, log_scale: bool | None,
           window: int = 20) -> list[int]:
    """The steps at which the monitor prints a warning line, replayed over ``metrics`` ({step: {key: value}});
    ``log_scale`` None: the monitor's default."""
    scale = {} if log_scale is None else {"log_scale": log_scale}
    monitor = CollapseMonitor(window=window, warmup=warmup, threshold=threshold, **scale)
    out = []
    for step in sorted(s for s in metrics if s >= 1):
        row = {k: metrics[step][k] for k in SIGNALS if k in metrics[step]}
        _z, lines = monitor.observe(step, row, where="")
        out += [step] * len(lines)
    return out


def load_testbed(candidate: str) -> dict[str, tuple[dict[int, dict], object]]:
    """``{run name: (metrics by step, the testbed's verdict)}`` of the kept runs of ``candidate``."""
    import instability_testbed as tb

    runs = {}
    for path in sorted((REPO / "benchmarks" / "results" / "instability" / candidate).glob("*.json")):
        metrics = {int(k): v for k, v in json.loads(path.read_text())["metrics"].items()}
        runs[path.stem] = (metrics, tb.instability(metrics))
    return runs


def load_jsonl(path: str) -> dict[int, dict]:
    """verl's ``file`` logger output as ``{step: data}``."""
    out: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        if "step" in row:
            out.setdefault(int(row["step"]), {}).update(row["data"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", default="lr4e-4")
    ap.add_argument("--healthy", nargs="*", default=[str(TINY_HEALTHY)],
                    help="metrics.jsonl of runs known to be healthy (default: the kept default tiny run)")
    ap.add_argument("--lead-window", type=int, default=10)
    a = ap.parse_args(argv)
    runs = load_testbed(a.candidate)
    healthy = [m for m, v in runs.values() if not v.failed] + [load_jsonl(p) for p in a.healthy]
    failing = [(name, m, v.onset) for name, (m, v) in runs.items() if v.failed]
    steps = sum(len([s for s in m if s >= 2 and any(k in m[s] for k in SIGNALS)]) for m in healthy)
    print(f"healthy runs: {len(healthy)} ({steps} scored steps); failing runs: {len(failing)} "
          f"(onsets {sorted(o for _, _, o in failing)})")
    print("| warm-up | threshold | log scale | false alarms / 100 healthy steps | failing runs warned in the "
          f"{a.lead_window} steps up to the onset | median lead (steps) | warnings > {a.lead_window} steps early |")
    print("|---|---|---|---|---|---|---|")
    for warmup, threshold, log_scale in GRID:
        false = sum(len(alarms(m, warmup, threshold, log_scale)) for m in healthy)
        leads, early = [], 0
        for _name, m, onset in failing:
            steps_warned = alarms(m, warmup, threshold, log_scale)
            inside = [s for s in steps_warned if onset - a.lead_window <= s <= onset]
            early += sum(s < onset - a.lead_window for s in steps_warned)
            if inside:
                leads.append(onset - inside[0])
        median = f"{statistics.median(leads):g}" if leads else "—"
        print(f"| {warmup} | {threshold:g} | {'yes' if log_scale else 'no'} | {100 * false / max(steps, 1):.2f} "
              f"({false}) | {len(leads)}/{len(failing)} | {median} | {early} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
