"""``python -m stapo_verl.eval`` end to end: generation records scored through the killable reward workers, then
the tables."""

from __future__ import annotations

import csv
import json

import pytest

from stapo_verl.eval.__main__ import main
from stapo_verl.eval.records import write_records
from support.rewards_reported import REPORTED


def test_cli_end_to_end(tmp_path, capsys):
    """Two runs of two AIME problems (32 samples each); one correct answer is a fraction, one run has 8 correct
    samples per problem, the other 16."""
    def gens(path, n_correct):
        recs = []
        for pid, gold in enumerate(["204", "\\frac{1}{2}"]):
            for j in range(32):
                ans = gold if j < n_correct else "7"
                recs.append({"benchmark": "aime24", "problem_id": str(pid), "sample_index": j,
                             "response": f"... \\boxed{{{ans}}}", "ground_truth": gold})
        return write_records(recs, path)

    gens(tmp_path / "a.jsonl", 8)
    gens(tmp_path / "b.jsonl", 16)
    assert main(["--runs", f"base={tmp_path / 'a.jsonl'}", f"new={tmp_path / 'b.jsonl'}", "--out",
                 str(tmp_path / "out")]) == 0
    with (tmp_path / "out" / "table.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert rows[1][:2] == ["base", "25.00"] and rows[2][:2] == ["new", "50.00"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["new"]["aime24"]["avg@k"] == pytest.approx(0.5) and summary["new"]["aime24"]["timeouts"] == 0
    assert "| base | 25.00 |" in (tmp_path / "out" / "table.md").read_text()
    assert main(["--runs", "bad", "--out", str(tmp_path / "o")]) == 2
    assert "NAME=path" in capsys.readouterr().err


def test_reported_inputs_through_the_eval_cli(tmp_path):
    recs = [{"benchmark": source, "data_source": source, "problem_id": str(i), "sample_index": 0, "response": text,
             "ground_truth": gold} for i, (source, text, gold, _) in enumerate(REPORTED)]
    write_records(recs, tmp_path / "g.jsonl")
    assert main(["--runs", f"A={tmp_path / 'g.jsonl'}", "--out", str(tmp_path / "out")]) == 0
    scored = [json.loads(line) for line in (tmp_path / "out" / "A.scored.jsonl").read_text().splitlines()]
    assert [r["acc"] for r in scored] == [acc for *_, acc in REPORTED]
    assert not any(r["timeout"] for r in scored)
