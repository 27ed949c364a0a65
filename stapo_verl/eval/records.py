"""Generation records (JSONL), the interface between ``generate_vllm.py`` and ``python -m stapo_verl.eval``.

One JSON object per line::

    {"benchmark": "aime24", "problem_id": "60", "sample_index": 0, "response": "...",
     "ground_truth": "204",                  # or, instead, "parquet": "<prepared parquet>" (looked up by problem_id)
     "data_source": "aime24",                # optional; defaults to the benchmark name
     "decoding": "t1.0_p1.0"}                # optional tag
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

REQUIRED = ("benchmark", "problem_id", "sample_index", "response")


class RecordError(ValueError):
    """A malformed generation record (the message names the file and line)."""


def write_records(records: Iterable[dict], path: str | Path) -> int:
    """Write records as JSONL (creating parent directories); returns the count.

    Raises:
        RecordError: a record misses a required key or has neither ``ground_truth`` nor ``parquet``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for rec in records:
            _check(rec, str(path), n)
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    return n


def _check(rec: dict, file: str, line: int) -> None:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise RecordError(f"{file}:{line + 1}: missing keys {missing}; required {list(REQUIRED)}")
    if "ground_truth" not in rec and "parquet" not in rec:
        raise RecordError(f"{file}:{line + 1}: needs 'ground_truth' or 'parquet' (a prepared parquet)")


def read_records(path: str | Path) -> Iterator[dict]:
    """Yield records, filling ``ground_truth`` from a linked prepared parquet when needed.

    Raises:
        RecordError: malformed JSON, missing keys, or a ``problem_id`` absent from the linked parquet.
    """
    lookups: dict[str, dict[str, str]] = {}
    with Path(path).open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}:{i + 1}: malformed JSON: {exc}") from exc
            _check(rec, str(path), i)
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
