"""Generation records (JSONL), the interface between ``generate_vllm.py`` and ``python -m stapo_verl.eval``.

One JSON object per line::

    {"benchmark": "aime24", "problem_id": "60", "sample_index": 0, "response": "...",
     "ground_truth": "204",                  # or, instead, "parquet": "<prepared parquet>" (looked up by problem_id)
     "data_source": "aime24",                # optional; defaults to the benchmark name
     "decoding": "t1.0_p1.0"}                # optional tag

``(benchmark, problem_id, sample_index)`` identifies a sample: a file that repeats one is rejected (naming both lines),
because the metrics would otherwise keep one of the two silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from stapo_verl.data.readers import iter_jsonl

REQUIRED = ("benchmark", "problem_id", "sample_index", "response")


class RecordError(ValueError):
    """A malformed generation record (the message names the file and line)."""


def write_records(records: Iterable[dict], path: str | Path) -> int:
    """Write records as JSONL (creating parent directories); returns the count.

    Raises:
        RecordError: a record misses a required key, has neither ``ground_truth`` nor ``parquet``, has a bad
            ``sample_index`` or repeats an earlier record's ``(benchmark, problem_id, sample_index)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    seen: set[tuple[str, str, int]] = set()
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            _check(rec, str(path), n)
            if record_key(rec) in seen:
                raise RecordError(f"{path}:{n + 1}: duplicate record (benchmark, problem_id, sample_index) = "
                                  f"{record_key(rec)}")
            seen.add(record_key(rec))
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def _check(rec: dict, file: str, line: int) -> None:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise RecordError(f"{file}:{line + 1}: missing keys {missing}; required {list(REQUIRED)}")
    if "ground_truth" not in rec and "parquet" not in rec:
        raise RecordError(f"{file}:{line + 1}: needs 'ground_truth' or 'parquet' (a prepared parquet)")
    index = rec["sample_index"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise RecordError(f"{file}:{line + 1}: sample_index must be an integer >= 0, got {index!r}")


def record_key(rec: dict) -> tuple[str, str, int]:
    """``(benchmark, problem_id, sample_index)`` of a record, as compared for duplicates (ids as strings)."""
    return str(rec["benchmark"]), str(rec["problem_id"]), int(rec["sample_index"])


def read_records(path: str | Path) -> Iterator[dict]:
    """Yield records, filling ``ground_truth`` from a linked prepared parquet when needed.

    Raises:
        RecordError: malformed JSON, missing keys, a bad ``sample_index``, a repeated
            ``(benchmark, problem_id, sample_index)`` (the message names the file, this line and the first one), or
            a ``problem_id`` absent from the linked parquet.
    """
    lookups: dict[str, dict[str, str]] = {}
    seen: dict[tuple[str, str, int], int] = {}
    for i, rec in iter_jsonl(path, lambda message, row: RecordError(f"{path}:{row + 1}: {message}")):
        _check(rec, str(path), i)
        key = record_key(rec)
        if key in seen:
            raise RecordError(f"{path}:{i + 1}: duplicate record (benchmark, problem_id, sample_index) = {key}; "
                              f"first at line {seen[key] + 1}")
        seen[key] = i
        if "ground_truth" not in rec:
            table = lookups.get(rec["parquet"])
            if table is None:
                import pyarrow.parquet as pq

                rows = pq.read_table(rec["parquet"], columns=["reward_model", "extra_info"]).to_pylist()
                table = {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"] for r in rows}
                lookups[rec["parquet"]] = table
            pid = str(rec["problem_id"])
            if pid not in table:
                raise RecordError(f"{path}:{i + 1}: problem_id {pid!r} not in {rec['parquet']}")
            rec["ground_truth"] = table[pid]
        yield rec
