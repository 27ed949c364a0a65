"""``python -m stapo_verl.eval --runs NAME=generations.jsonl [NAME2=...] --out DIR`` (``stapo-eval``).

Scores every generation record (:mod:`stapo_verl.eval.records`) with :func:`stapo_verl.rewards.compute_score`
(rule-based, hard timeouts), then writes ``<out>/table.md``, ``table.csv``, ``table_pass.csv``,
``summary.json`` and ``<out>/<NAME>.scored.jsonl``. The first run is the baseline of the relative gain. Problems with
fewer than k samples are listed under the tables (and printed); a repeated sample is an error (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stapo_verl.eval.records import RecordError, read_records
from stapo_verl.eval.scoring import score_many
from stapo_verl.eval.table import build_table, short_problem_notes, summarize_run, to_markdown, write_tables


def parse_runs(specs: list[str]) -> dict[str, str]:
    """``["A=a.jsonl", "B=b.jsonl"]`` → ``{"A": "a.jsonl", ...}`` (order kept).

    Raises:
        ValueError: an item without ``=``, an empty name, or a repeated name.
    """
    runs: dict[str, str] = {}
    for item in specs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--runs item {item!r} must look like NAME=path/to/generations.jsonl")
        if name in runs:
            raise ValueError(f"run name {name!r} given twice")
        runs[name] = path
    return runs


def score_run(path: str, timeout_s: float | None = None) -> list[dict]:
    """Read and score one generations file; returns records with ``acc``, ``score``, ``pred``, ``timeout``."""
    recs = list(read_records(path))
    items = [(r.get("data_source") or r["benchmark"], r["response"], str(r["ground_truth"])) for r in recs]
    for rec, res in zip(recs, score_many(items, timeout_s=timeout_s)):
        rec.update({k: res[k] for k in ("score", "acc", "pred", "timeout", "no_box")})
    return recs


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on bad input)."""
    p = argparse.ArgumentParser(prog="stapo-eval", description=__doc__.split("\n")[0])
    p.add_argument("--runs", nargs="+", required=True, help="NAME=generations.jsonl, first = baseline")
    p.add_argument("--out", required=True, help="output directory")
    # Evaluation is not latency-bound: a longer budget than training's 5 s avoids false negatives from slow sympy.
    p.add_argument("--timeout-s", type=float, default=20.0, help="per-sample scoring timeout in seconds")
    args = p.parse_args(argv)
    try:
        runs = parse_runs(args.runs)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        summaries = {}
        for name, path in runs.items():
            scored = score_run(path, args.timeout_s)
            with (out / f"{name}.scored.jsonl").open("w", encoding="utf-8") as fh:
                for r in scored:
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
            summaries[name] = summarize_run(scored)
    except (ValueError, OSError) as exc:  # RecordError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (out / "summary.json").write_text(json.dumps(summaries, indent=2), encoding="utf-8")
    write_tables(summaries, out)
    print(to_markdown(*build_table(summaries)))
    for line in short_problem_notes(summaries):
        print(f"note: {line}")
    return 0


__all__ = ["RecordError", "main", "parse_runs", "score_run"]

if __name__ == "__main__":
    sys.exit(main())
