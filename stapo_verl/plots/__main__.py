"""CLI of :mod:`stapo_verl.plots`.

::

    python -m stapo_verl.plots report --run RUN_DIR [--wall-seconds S] [--metrics FILE] [--tokens GLOB]
                                      [--val-generations DIR]
        → RUN_DIR/plot.png, RUN_DIR/scatter.png, RUN_DIR/summary.json, RUN_DIR/summary.md
    python -m stapo_verl.plots overlay --runs DIR [DIR ...] [--labels L ...] --out FILE.png

``report`` covers the steps of one metrics file: ``--metrics`` defaults to ``RUN_DIR/metrics.jsonl`` (the whole run
with the tiny recipes, which merge its invocations and keep an earlier run's file as ``metrics.<ts>.jsonl``; verl's
file logger alone truncates it when an invocation starts), ``--tokens`` to ``RUN_DIR/**/stapo_tokens.dp*.jsonl``,
``--val-generations`` to
``RUN_DIR/val_generations`` (verl's ``trainer.validation_data_dir``; needed for standard errors). Exit code 2 with
a one-line message on a missing or malformed file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stapo_verl.plots.loading import RunFileError
from stapo_verl.plots.overlay import overlay
from stapo_verl.plots.report import to_markdown, write_report


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the sub-command, return the exit code."""
    ap = argparse.ArgumentParser(prog="python -m stapo_verl.plots", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="plots + summary of one run invocation")
    r.add_argument("--run", type=Path, required=True, help="run directory")
    r.add_argument("--wall-seconds", type=float, default=None, help="wall time of the invocation (s)")
    r.add_argument("--metrics", type=Path, default=None, help="metrics JSONL (default RUN/metrics.jsonl)")
    r.add_argument("--tokens", default=None, help="token-dump glob (default RUN/**/stapo_tokens.dp*.jsonl)")
    r.add_argument("--val-generations", type=Path, default=None,
                   help="verl validation dump dir (default RUN/val_generations)")
    o = sub.add_parser("overlay", help="several runs on the same curves")
    o.add_argument("--runs", type=Path, nargs="+", required=True)
    o.add_argument("--labels", nargs="+", default=None)
    o.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "report":
            if not a.run.is_dir():
                raise FileNotFoundError(f"--run {a.run} is not a directory")
            rep = write_report(a.run, a.metrics, a.tokens, a.val_generations, a.wall_seconds)
            print(to_markdown(rep.summary), end="")
            print(f"wrote {a.run}/plot.png, scatter.png, summary.json, summary.md")
        else:
            overlay(a.runs, a.out, a.labels)
            print(f"wrote {a.out}")
    except (FileNotFoundError, RunFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
