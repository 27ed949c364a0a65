"""Dataset preparation on the vendored slices of the published files (``tests/data/benchmarks``), and on
synthetic files for the layouts and errors that the slices do not cover."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stapo_verl.data import JUSTRL_SUFFIX, SCHEMA, DataPrepError
from stapo_verl.data.datasets import DAPO_PREFIX, DAPO_SUFFIX, SPECS, clean_olympiad_answer
from stapo_verl.data.prepare import main, prepare_dataset
from stapo_verl.data.readers import resolve_source
from stapo_verl.data.split import take_rows, train_val_split
from stapo_verl.rewards import scorer_for
from support.data_benchmarks import BENCHMARKS_DIR, gold_rows, manifest

#: rows of each vendored slice (``tests/data/benchmarks/build.py``); DAPO: 45 rows, 3 repeated problems.
SLICE_ROWS = {"dapo-math-17k": 45, "aime24": 6, "aime25": 30, "amc23": 40, "math500": 40, "minerva": 20,
              "olympiadbench": 18, "gsm8k": 22}
WRITTEN_ROWS = {**SLICE_ROWS, "dapo-math-17k": 42}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    assert main(["--dataset", "all", "--src", str(BENCHMARKS_DIR), "--out", str(out)]) == 0
    return out


def _rows(prepared: Path, name: str) -> list[dict]:
    return pq.read_table(prepared / f"{name}.parquet").to_pylist()


@pytest.mark.parametrize("name", sorted(SLICE_ROWS))
def test_prepared_rows_and_schema(prepared, name):
    table = pq.read_table(prepared / f"{name}.parquet")
    assert table.num_rows == WRITTEN_ROWS[name]
    assert table.schema.equals(SCHEMA), table.schema
    assert table.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert table.schema.field("extra_info").type.field("index").type == pa.int64()
    rows = table.to_pylist()
    for i, r in enumerate(rows):
        assert r["ability"] == "math" and r["reward_model"]["style"] == "rule"
        gt = r["reward_model"]["ground_truth"]
        assert isinstance(gt, str) and gt.strip() == gt and gt and "$" not in gt.replace("\\$", "")
        assert len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user"
        assert r["prompt"][0]["content"] == r["extra_info"]["problem"] + JUSTRL_SUFFIX
        assert r["extra_info"]["index"] == i and r["extra_info"]["benchmark"] == name
        assert r["extra_info"]["split"] == ("train" if name == "dapo-math-17k" else "test")
    sources = {r["data_source"] for r in rows}
    assert sources == {"math_dapo" if name == "dapo-math-17k" else name}
    scorer_for(sources.pop())  # routes without raising


@pytest.mark.parametrize("name", sorted(SLICE_ROWS))
def test_prepared_ground_truths_match_the_vendored_gold_file(name, tmp_path):
    """The gold file (every row of the original, written by build.py) and preparing the slice agree row by row:
    the differential reward test scores what preparation writes."""
    gold = {row: answer for row, _, answer in gold_rows(name)}
    source_rows = manifest()[name]["slice_source_rows"]
    summary = prepare_dataset(name, str(BENCHMARKS_DIR), tmp_path, dedup=False)
    rows = pq.read_table(summary.out_path).to_pylist()
    assert len(rows) == len(source_rows) == SLICE_ROWS[name]
    assert [r["reward_model"]["ground_truth"] for r in rows] == [gold[i] for i in source_rows]


def test_answer_canonicalisation(prepared):
    aime24 = {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"] for r in _rows(prepared, "aime24")}
    assert aime24 == {"60": "204", "67": "25", "74": "480", "75": "73", "83": "45", "84": "33"}  # "025" → "25"
    amc = {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"] for r in _rows(prepared, "amc23")}
    assert amc["0"] == "27" and amc["17"] == "-1"  # floats 27.0 / -1.0
    minerva = [r["reward_model"]["ground_truth"] for r in _rows(prepared, "minerva")]
    assert minerva[:2] == ["1.6", "4.5e33"]  # the last \boxed{} of the solution
    oly = {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"] for r in _rows(prepared, "olympiadbench")}
    assert oly["1610"] == "\\frac{1}{2 n+2}"  # "$...$" stripped
    assert oly["1664"] == "69,84"  # "$69$,$84$": every inner "$" removed
    assert oly["1760"] == "\\angle B E A_{1}=90,\\angle A E B_{1}=90"
    assert oly["1970"] == "(-\\infty, 0) \\cup\\{1\\}"  # "$...$." : the sentence period goes too
    gsm = [r["reward_model"]["ground_truth"] for r in _rows(prepared, "gsm8k")]
    assert gsm[0] == "18" and all("," not in g for g in gsm) and len(gsm) == 22


def test_olympiad_answers_in_the_gold_file_have_no_math_delimiters():
    golds = [g for _, _, g in gold_rows("olympiadbench")]
    assert len(golds) == 675 and not any("$" in g.replace("\\$", "") for g in golds)


def test_clean_olympiad_answer():
    assert clean_olympiad_answer("$69$,$84$") == "69,84"
    assert clean_olympiad_answer("$221,$8$") == "221,8"
    assert clean_olympiad_answer("2") == "2"
    assert clean_olympiad_answer("\\$5") == "\\$5"  # an escaped dollar is text


def test_dapo_dedup_on_the_vendored_slice(prepared, tmp_path, capsys):
    """The slice repeats three problems (rows 35/179 with different answers, 226/261 and 234/248 alike)."""
    rows = _rows(prepared, "dapo-math-17k")
    problems = [" ".join(r["extra_info"]["problem"].split()) for r in rows]
    assert len(set(problems)) == len(problems) == 42
    assert all(r["reward_model"]["ground_truth"].lstrip("-").isdigit() for r in rows)
    summary = prepare_dataset("dapo-math-17k", str(BENCHMARKS_DIR), tmp_path)
    assert summary.rows_read == 45 and summary.rows_written == 42
    assert summary.dropped == {"duplicate_problem": 2, "duplicate_problem_other_answer": 1}
    raw = prepare_dataset("dapo-math-17k", str(BENCHMARKS_DIR), tmp_path / "raw", dedup=False)
    assert raw.rows_written == 45 and raw.dropped == {}


def _write_jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return path


def test_dapo_original_layout_dedup_and_template(tmp_path, capsys):
    """The original BytedTsinghua layout: DAPO 'Answer:' template, uuid index, each prompt repeated."""
    recs = []
    for rep in range(3):
        for k, (prob, ans) in enumerate([("What is 1+1?", "2"), ("What is 2+3?", "5")]):
            recs.append({"data_source": "math_dapo", "ability": "MATH",
                         "prompt": [{"role": "user", "content": DAPO_PREFIX + prob + DAPO_SUFFIX}],
                         "reward_model": {"ground_truth": ans, "style": "rule-lighteval/MATH_v2"},
                         "extra_info": {"index": f"uuid-{k}-{rep}"}})
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "dapo-math-17k.parquet")
    assert main(["--dataset", "dapo-math-17k", "--src", str(tmp_path / "dapo-math-17k.parquet"),
                 "--out", str(tmp_path / "out")]) == 0
    assert "read 6 rows" in capsys.readouterr().out
    rows = pq.read_table(tmp_path / "out" / "dapo-math-17k.parquet").to_pylist()
    assert [r["extra_info"]["problem"] for r in rows] == ["What is 1+1?", "What is 2+3?"]
    assert rows[0]["prompt"][0]["content"] == "What is 1+1?" + JUSTRL_SUFFIX
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "5"]


def test_open_r1_processed_layout(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Find x.", "solution": "7", "data_source": "math_dapo"}])
    summary = prepare_dataset("dapo-math-17k", str(path), tmp_path / "out")
    row = pq.read_table(summary.out_path).to_pylist()[0]
    assert row["extra_info"]["problem"] == "Find x." and row["reward_model"]["ground_truth"] == "7"


def test_max_rows_and_split_helpers(tmp_path):
    path = _write_jsonl(tmp_path / "m.jsonl", [{"problem": f"p{i}", "answer": str(i)} for i in range(10)])
    assert main(["--dataset", "math500", "--src", str(path), "--out", str(tmp_path), "--max-rows", "4"]) == 0
    rows = pq.read_table(tmp_path / "math500.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "1", "2", "3"]
    sample = take_rows(list(range(10)), 3, seed=1)
    assert len(sample) == 3 and sample == sorted(sample) and sample == take_rows(list(range(10)), 3, seed=1)
    train, val = train_val_split(list(range(10)), 2)
    assert len(train) == 8 and len(val) == 2 and not set(train) & set(val)
    with pytest.raises(ValueError, match="max_rows must be >= 1, got 0"):
        take_rows([1, 2, 3], 0)


def test_errors_name_file_and_row(tmp_path, capsys):
    assert main(["--dataset", "nope", "--src", str(tmp_path), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'nope'" in err and "math500" in err
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "a", "answer": "1"}, {"problem": "b"}])
    with pytest.raises(DataPrepError, match=r"missing column 'answer'.*bad\.jsonl, row 1"):
        prepare_dataset("math500", str(bad), tmp_path / "o")
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"problem": "a", "answer": "  "}])
    with pytest.raises(DataPrepError, match=r"empty answer.*empty\.jsonl, row 0"):
        prepare_dataset("math500", str(empty), tmp_path / "o")
    aime = _write_jsonl(tmp_path / "aime.jsonl", [{"problem": "a", "answer": "1/2"}])
    with pytest.raises(DataPrepError, match="answer '1/2' is not a number"):
        prepare_dataset("aime24", str(aime), tmp_path / "o")
    gsm = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": "a", "answer": "no marker"}])
    with pytest.raises(DataPrepError, match="####"):
        prepare_dataset("gsm8k", str(gsm), tmp_path / "o")
    oly = _write_jsonl(tmp_path / "oly.jsonl", [{"question": "a", "final_answer": ["$ $"]}])
    with pytest.raises(DataPrepError, match=r"empty answer.*oly\.jsonl, row 0"):
        prepare_dataset("olympiadbench", str(oly), tmp_path / "o")
    (tmp_path / "broken.jsonl").write_text('{"problem": "a", "answer": "1"}\n{oops\n')
    with pytest.raises(DataPrepError, match=r"malformed JSON.*row 1"):
        prepare_dataset("math500", str(tmp_path / "broken.jsonl"), tmp_path / "o")
    (tmp_path / "emptydir").mkdir()
    with pytest.raises(DataPrepError, match="no dataset file in directory"):
        prepare_dataset("math500", str(tmp_path / "emptydir"), tmp_path / "o")


def test_hf_id_is_not_downloaded_when_resolving():
    assert resolve_source("HuggingFaceH4/MATH-500", ("test.jsonl",)) == "HuggingFaceH4/MATH-500"
    with pytest.raises(DataPrepError, match="neither an existing file"):
        resolve_source("./missing/file.jsonl", ("test.jsonl",))


def test_every_dataset_has_a_vendored_slice():
    for name, spec in SPECS.items():
        assert any((BENCHMARKS_DIR / rel).is_file() for rel in spec.local_files if "/" in rel), name
