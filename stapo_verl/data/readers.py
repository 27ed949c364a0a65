"""Read the published dataset files: local JSONL/JSON/Parquet, a directory holding them, or a HF hub id.

JSONL is read line by line with :mod:`json` so that errors name the exact row and no type coercion happens
(AIME24 keeps ``"025"`` as a string, AMC23 keeps floats); Parquet with :mod:`pyarrow`; HF ids with
:func:`datasets.load_dataset` (imported lazily: on clusters only, never in tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from stapo_verl.data.errors import DataPrepError


def resolve_source(src: str, candidates: tuple[str, ...]) -> str:
    """Turn ``--src`` into one readable file path (or return a HF id unchanged).

    Args:
        src: a file, a directory, or a HF hub id (``owner/name`` or ``owner/name:config``, not existing locally).
        candidates: relative paths to try inside a directory, e.g. ``("math500/test.jsonl", "test.jsonl")``.

    Raises:
        DataPrepError: a directory without any candidate file.
    """
    path = Path(src)
    if path.is_file():
        return str(path)
    if path.is_dir():
        for rel in candidates:
            if (path / rel).is_file():
                return str(path / rel)
        raise DataPrepError(f"no dataset file in directory {src!r}; looked for {list(candidates)}", file=src)
    if src.count("/") == 1 and not src.startswith((".", "/")):
        return src  # HF hub id
    raise DataPrepError(f"--src {src!r} is neither an existing file/directory nor a HF id 'owner/name'", file=src)


def iter_jsonl(path: str | Path, make_error: Callable[[str, int], Exception]) -> Iterator[tuple[int, dict]]:
    """Yield ``(row, object)`` for every non-blank line of a JSONL file; ``row`` is 0-based (line number − 1).

    Shared by the dataset readers (:func:`iter_records`) and the generation records
    (:func:`stapo_verl.eval.records.read_records`), which differ only in the error type they raise.

    Args:
        path: the JSONL file.
        make_error: ``(message, row) -> exception`` raised for a malformed line or a line that is not an object.

    Raises:
        OSError: the file cannot be opened; whatever ``make_error`` returns, for bad lines.
    """
    with Path(path).open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise make_error(f"malformed JSON line: {exc}", i) from exc
            if not isinstance(rec, dict):
                raise make_error(f"expected a JSON object, got {type(rec).__name__}", i)
            yield i, rec


def iter_records(source: str, hf_split: str = "train") -> Iterator[tuple[int, dict]]:
    """Yield ``(row_index, record)`` from a file or HF id.

    Args:
        source: output of :func:`resolve_source`.
        hf_split: split to load when ``source`` is a HF id.

    Raises:
        DataPrepError: unreadable file, malformed JSON line (naming file and row), unsupported extension.
    """
    path = Path(source)
    if not path.exists():
        try:
            import datasets  # lazy: only for cluster use with hub ids
        except ImportError as exc:  # pragma: no cover
            raise DataPrepError("reading a HF id needs the 'datasets' package", file=source) from exc
        name, _, config = source.partition(":")  # "openai/gsm8k:main" selects a config
        ds = datasets.load_dataset(name, config or None, split=hf_split)
        for i, rec in enumerate(ds):
            yield i, dict(rec)
        return
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from iter_jsonl(path, lambda message, row: DataPrepError(message, file=source, row=row))
    elif suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise DataPrepError("a .json source must hold a list of records", file=source)
        yield from enumerate(data)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        offset = 0
        for batch in table.to_batches(max_chunksize=10_000):  # bounded memory for the 1.79M-row raw DAPO file
            for j, rec in enumerate(batch.to_pylist()):
                yield offset + j, rec
            offset += batch.num_rows
    else:
        raise DataPrepError(f"unsupported file type {suffix!r}; allowed: .jsonl, .json, .parquet", file=source)
