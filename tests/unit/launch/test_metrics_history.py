"""metrics.jsonl across invocations of one run (``stapo_verl.launch.train``): rows of steps the checkpoint holds are
kept, rows of steps trained again are replaced, one row per step."""

from __future__ import annotations

import json

from stapo_verl.launch.train import HISTORY_FILE, finish_metrics, prepare_metrics


def _write(path, rows, torn=False):
    text = "".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows)
    path.write_text(text + ('{"step": 9, "da' if torn else ""))


def _read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_killed_attempt_rows_are_replaced_and_history_is_whole(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    # invocation 1 ran steps 0-5 (validation at 0), checkpoint at 4, then was killed with kill -9 (torn last line)
    _write(metrics, [(0, {"val": 0.5}), *[(s, {"loss": s}) for s in range(1, 6)]], torn=True)
    prepare_metrics(str(tmp_path), 4)
    assert not metrics.exists() and [r["step"] for r in _read(tmp_path / HISTORY_FILE)] == [0, 1, 2, 3, 4]
    # invocation 2 (verl truncates metrics.jsonl): validation at the resumed step 4, then steps 5-6; killed again
    _write(metrics, [(4, {"val": 0.7}), (5, {"loss": 50}), (6, {"loss": 60})])
    prepare_metrics(str(tmp_path), 5)
    # invocation 3 trains step 6 again and ends normally
    _write(metrics, [(5, {"val": 0.8}), (6, {"loss": 61})])
    finish_metrics(str(tmp_path))
    rows = _read(metrics)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    assert rows[4]["data"] == {"loss": 4, "val": 0.7} and rows[5]["data"] == {"loss": 50, "val": 0.8}
    assert rows[6]["data"] == {"loss": 61}
    assert not (tmp_path / HISTORY_FILE).exists()


def test_fresh_start_keeps_an_old_file_aside(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    _write(metrics, [(1, {"loss": 1})])
    (tmp_path / HISTORY_FILE).write_text("")
    prepare_metrics(str(tmp_path), 0)
    assert not metrics.exists() and not (tmp_path / HISTORY_FILE).exists()
    (old,) = tmp_path.glob("metrics.*.jsonl")
    assert _read(old) == [{"step": 1, "data": {"loss": 1}}]
    _write(metrics, [(1, {"loss": 2})])
    finish_metrics(str(tmp_path))  # nothing to merge: verl's file as it is
    assert _read(metrics) == [{"step": 1, "data": {"loss": 2}}]
