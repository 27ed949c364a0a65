"""Readers for the files a run leaves behind: verl's metrics JSONL, STAPO's token dump, verl's validation dump.

* Metrics: verl's ``file`` logger (``verl/utils/tracking.py::FileLogger``) writes one line per step,
  ``{"step": int, "data": {metric: value}}``, to ``$VERL_FILE_LOGGER_PATH`` and opens it with mode ``"wb"``,
  so on its own one file holds one invocation; the tiny recipes point it at ``RUN_DIR/metrics.jsonl`` and merge the
  run's invocations into it, one row a step (:mod:`stapo_verl.launch.train`), and rename an earlier run's file to
  ``metrics.<unix time>.jsonl`` on a fresh start.
* Token dump: ``stapo_tokens.dp<rank>.jsonl`` files anywhere under the run dir, one silenced or kept candidate
  per line (schema :data:`ROW_TYPES`), written by the plugin's worker hook.
* Validation generations: verl's ``trainer.validation_data_dir`` dump (``ray_trainer.py::_write_generations``),
  ``<global step>.jsonl`` with ``input``, ``output``, ``gts``, ``score``, ``step`` and the reward function's extra
  keys (``acc`` from :func:`stapo_verl.rewards.compute_score`).
"""

from __future__ import annotations

import glob as _glob
import json
import math
from pathlib import Path

from stapo_verl.data.readers import iter_jsonl
from stapo_verl.minibatch.dump_schema import KINDS, ROW_TYPES

METRICS_FILE = "metrics.jsonl"
TOKEN_DUMP_PATTERN = "stapo_tokens.dp*.jsonl"
VAL_GENERATIONS_DIR = "val_generations"
_NUM = (int, float)  # a metric value (bool is rejected where a number is expected)


class RunFileError(ValueError):
    """A run file is malformed; the message names the file, the line and the offending key or value."""


def _jsonl(path: Path):
    """``(line number, object)`` of a JSONL file via :func:`stapo_verl.data.readers.iter_jsonl`; bad lines raise
    :class:`RunFileError` naming ``file:line`` (1-based)."""
    return ((i + 1, rec) for i, rec in
            iter_jsonl(path, lambda msg, i: RunFileError(f"{path}:{i + 1}: {msg}")))


def read_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """Parse one verl ``file``-logger JSONL into ``{step: {metric: value}}``.

    Numeric values only (``bool``, strings and lists are dropped: verl logs only scalars there, but the logger
    accepts anything). A step logged on several lines (validation and training of the same step) is merged,
    later lines winning.

    Raises:
        FileNotFoundError: ``path`` does not exist (the message says which logger setting writes it).
        RunFileError: a line is not JSON or lacks an int ``step`` / dict ``data`` (file and line named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metrics file {path} not found (verl writes it with trainer.logger=[...,file] "
                                f"to $VERL_FILE_LOGGER_PATH)")
    out: dict[int, dict[str, float]] = {}
    for n, rec in _jsonl(path):
        if not isinstance(rec.get("step"), int) or not isinstance(rec.get("data"), dict):
            raise RunFileError(f"{path}:{n}: expected {{\"step\": int, \"data\": {{metric: value}}}}, "
                               f"got {json.dumps(rec)[:120]!r}")
        row = out.setdefault(rec["step"], {})
        for k, v in rec["data"].items():
            if isinstance(v, _NUM) and not isinstance(v, bool):
                row[k] = float(v)
    return out


def find_token_files(run_dir: str | Path | None = None, pattern: str | None = None) -> list[Path]:
    """Token-dump files: ``pattern`` (a glob, ``**`` allowed) if given, else ``RUN_DIR/**/stapo_tokens.dp*.jsonl``.

    Returns a sorted list, empty when there is no dump (not an error: dumping can be switched off).
    """
    if pattern is not None:
        return sorted(Path(p) for p in _glob.glob(str(pattern), recursive=True) if Path(p).is_file())
    if run_dir is None:
        raise ValueError("find_token_files needs run_dir or pattern")
    return sorted(p for p in Path(run_dir).rglob(TOKEN_DUMP_PATTERN) if p.is_file())


def _check_row(rec, path: Path, n: int) -> dict:
    if not isinstance(rec, dict):
        raise RunFileError(f"{path}:{n}: expected a JSON object, got {type(rec).__name__}")
    missing = [k for k in ROW_TYPES if k not in rec]
    if missing:
        raise RunFileError(f"{path}:{n}: missing key(s) {missing}; a token-dump row has {list(ROW_TYPES)}")
    for k, types in ROW_TYPES.items():
        v = rec[k]
        if isinstance(v, bool) or not isinstance(v, types):
            raise RunFileError(f"{path}:{n}: key {k!r} = {v!r} has type {type(v).__name__}; "
                               f"allowed: {'/'.join(t.__name__ for t in types)}")
    if rec["kind"] not in KINDS:
        raise RunFileError(f"{path}:{n}: key 'kind' = {rec['kind']!r}; allowed: {list(KINDS)}")
    if not (0.0 <= rec["p"] <= 1.0):
        raise RunFileError(f"{path}:{n}: key 'p' = {rec['p']!r} is not a probability in [0, 1]")
    if not math.isfinite(rec["entropy"]) or rec["entropy"] < 0:
        raise RunFileError(f"{path}:{n}: key 'entropy' = {rec['entropy']!r}; allowed: finite and >= 0 (nats)")
    return rec


def read_tokens(files: list[Path]) -> list[dict]:
    """All rows of the given token-dump files, each checked against :data:`ROW_TYPES` and :data:`KINDS`.

    Each row gets ``"_file"`` (the path it came from) added.

    Raises:
        RunFileError: a line that is not JSON, misses a key, has a wrong type, an unknown ``kind``, ``p``
            outside [0, 1] or a negative/non-finite ``entropy`` — the message names file and line.
    """
    rows = []
    for path in files:
        for n, rec in _jsonl(Path(path)):
            rec = _check_row(rec, Path(path), n)
            rec["_file"] = str(path)
            rows.append(rec)
    return rows


def read_val_generations(val_dir: str | Path, steps: set[int] | None = None) -> dict[int, list[dict]]:
    """verl's validation dump ``<val_dir>/<step>.jsonl`` → ``{step: [row, ...]}`` (only ``steps`` if given).

    Returns ``{}`` when the directory does not exist (``trainer.validation_data_dir`` unset).

    Raises:
        RunFileError: a line that is not a JSON object (file and line named).
    """
    val_dir = Path(val_dir)
    out: dict[int, list[dict]] = {}
    if not val_dir.is_dir():
        return out
    for path in sorted(val_dir.glob("*.jsonl")):
        if not path.stem.isdigit() or (steps is not None and int(path.stem) not in steps):
            continue
        out[int(path.stem)] = [rec for _, rec in _jsonl(path)]
    return out
