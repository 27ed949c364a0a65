"""``python -m stapo_verl.data.prepare``: published dataset files → verl RL parquet (:mod:`stapo_verl.data.schema`).

Examples::

    python -m stapo_verl.data.prepare --dataset math500 --src originals/math500/test.jsonl --out data/
    python -m stapo_verl.data.prepare --dataset all --src originals --out data/
    python -m stapo_verl.data.prepare --dataset dapo-math-17k --src BytedTsinghua-SIA/DAPO-Math-17k --out data/

Writes ``<out>/<dataset>.parquet`` and prints a summary (rows read, written, dropped with reasons). DAPO-Math-17k is
deduplicated on the whitespace-normalised problem text, keeping the first occurrence (the published file repeats
each prompt about 100 times, so an "epoch" would see every problem 100 times); ``--no-dedup`` keeps JustRL's raw
layout. ``originals`` is a directory laid out like ``tests/data/benchmarks`` (whose small slices work too).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from stapo_verl.data.datasets import SPECS, DatasetSpec, get_spec
from stapo_verl.data.errors import DataPrepError
from stapo_verl.data.readers import iter_records, resolve_source
from stapo_verl.data.schema import make_row, write_parquet
from stapo_verl.data.split import take_rows


@dataclasses.dataclass
class PrepareSummary:
    """Counts for one prepared dataset (``dropped`` maps reason → rows)."""

    dataset: str
    source: str
    out_path: str
    rows_read: int
    rows_written: int
    dropped: dict[str, int]

    def line(self) -> str:
        """One human-readable summary line."""
        drops = ", ".join(f"{k}={v}" for k, v in self.dropped.items()) or "none"
        return (f"{self.dataset}: read {self.rows_read} rows from {self.source}, wrote {self.rows_written} "
                f"to {self.out_path}; dropped: {drops}")


def build_rows(spec: DatasetSpec, source: str, dedup: bool | None = None) -> tuple[list[dict], int, dict[str, int]]:
    """Read ``source`` and convert every record with ``spec``.

    Args:
        spec: the dataset spec.
        source: a resolved file path or HF id (:func:`stapo_verl.data.readers.resolve_source`).
        dedup: override ``spec.dedup``.

    Returns:
        ``(rows, rows_read, dropped)``.

    Raises:
        DataPrepError: missing column / empty answer (naming file and row), or an empty source.
    """
    dedup = spec.dedup if dedup is None else dedup
    rows: list[dict] = []
    seen: dict[str, str] = {}
    dropped: dict[str, int] = {}
    n_read = 0
    for row_idx, rec in iter_records(source, hf_split=spec.split):
        n_read += 1
        problem, answer, problem_id = spec.extract(rec, source, row_idx)
        if dedup:
            key = " ".join(problem.split())
            if key in seen:
                reason = "duplicate_problem" if seen[key] == answer else "duplicate_problem_other_answer"
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            seen[key] = answer
        rows.append(make_row(data_source=spec.data_source, benchmark=spec.name, split=spec.split, index=len(rows),
                             problem=problem, answer=answer, problem_id=problem_id, source_row=row_idx))
    if not rows:
        raise DataPrepError("source has no rows", file=source)
    return rows, n_read, dropped


def prepare_dataset(name: str, src: str, out_dir: str | Path, max_rows: int | None = None,
                    dedup: bool | None = None, seed: int | None = None) -> PrepareSummary:
    """Prepare one dataset into ``<out_dir>/<name>.parquet``.

    Args:
        name: a key of :data:`stapo_verl.data.datasets.SPECS`.
        src: file, directory (laid out like ``tests/data/benchmarks``) or HF id.
        out_dir: output directory (created).
        max_rows: keep at most this many rows after deduplication (``--max-rows``).
        dedup: override the dataset's deduplication default.
        seed: with ``max_rows``, sample rows with this seed instead of taking the first ones.

    Raises:
        DataPrepError: see :func:`build_rows` and :func:`stapo_verl.data.datasets.get_spec`.
    """
    spec = get_spec(name)
    source = resolve_source(src, spec.local_files)
    rows, n_read, dropped = build_rows(spec, source, dedup=dedup)
    kept = take_rows(rows, max_rows, seed)
    if len(kept) < len(rows):
        dropped["max_rows"] = len(rows) - len(kept)
        for i, row in enumerate(kept):
            row["extra_info"]["index"] = i
    out_path = write_parquet(kept, Path(out_dir) / f"{name}.parquet")
    return PrepareSummary(name, source, str(out_path), n_read, len(kept), dropped)


def prepare_all(src_dir: str, out_dir: str | Path, max_rows: int | None = None) -> list[PrepareSummary]:
    """Prepare every dataset whose file exists under ``src_dir`` (``--dataset all``).

    Raises:
        DataPrepError: ``src_dir`` is not a directory or holds none of the datasets.
    """
    if not Path(src_dir).is_dir():
        raise DataPrepError("--dataset all needs --src to be a directory laid out like tests/data/benchmarks", file=src_dir)
    summaries = []
    for name, spec in SPECS.items():
        # Only the dataset's own folder counts here: a bare "test.jsonl" would be ambiguous between datasets.
        if any((Path(src_dir) / rel).is_file() for rel in spec.local_files if "/" in rel):
            summaries.append(prepare_dataset(name, src_dir, out_dir, max_rows=max_rows))
    if not summaries:
        raise DataPrepError(f"no known dataset folder under {src_dir!r}", file=src_dir)
    return summaries


def build_parser() -> argparse.ArgumentParser:
    """The CLI argument parser (``stapo-prepare``)."""
    p = argparse.ArgumentParser(prog="stapo-prepare", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help=f"one of {sorted(SPECS)} or 'all'")
    p.add_argument("--src", required=True, help="local file, directory (laid out like tests/data/benchmarks) or HF id owner/name[:config]")
    p.add_argument("--out", required=True, help="output directory; writes <out>/<dataset>.parquet")
    p.add_argument("--max-rows", type=int, default=None, help="keep at most N rows (after deduplication)")
    p.add_argument("--seed", type=int, default=None, help="with --max-rows: random sample instead of the first N")
    p.add_argument("--no-dedup", action="store_true", help="keep repeated DAPO prompts (JustRL's raw layout)")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit code (2 on a :class:`DataPrepError`, whose message names file and row)."""
    args = build_parser().parse_args(argv)
    try:
        if args.dataset == "all":
            summaries = prepare_all(args.src, args.out, max_rows=args.max_rows)
        else:
            summaries = [prepare_dataset(args.dataset, args.src, args.out, max_rows=args.max_rows,
                                         dedup=False if args.no_dedup else None, seed=args.seed)]
    except DataPrepError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for s in summaries:
        print(s.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
