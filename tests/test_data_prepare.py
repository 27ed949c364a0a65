"""Dataset preparation: every published file in shared/data → verl parquet with the expected rows and schema."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stapo_verl.data import JUSTRL_SUFFIX, SCHEMA, DataPrepError
from stapo_verl.data.datasets import DAPO_PREFIX, DAPO_SUFFIX
from stapo_verl.data.prepare import main, prepare_dataset
from stapo_verl.data.readers import resolve_source
from stapo_verl.data.split import take_rows, train_val_split
from stapo_verl.rewards import scorer_for


def shared_data_dir() -> Path | None:
    """``<repo>/../shared/data`` (CI layout), else ``$STAPO_SHARED_DIR`` (its ``data`` subfolder or itself)."""
    path = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    if path.is_dir():
        return path
    env = os.environ.get("STAPO_SHARED_DIR")
    if env:
        for cand in (Path(env) / "data", Path(env)):
            if cand.is_dir():
                return cand
    return None


SHARED = shared_data_dir()
# shared/ lies beside the clone in CI and on developer machines: its absence is a failure, never a skip.
needs_shared = pytest.mark.usefixtures("shared_present")


#: rows written per dataset; DAPO: 17,917 published rows → 17,188 after deduplication (see docs).
EXPECTED_ROWS = {"dapo-math-17k": 17188, "aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272,
                 "olympiadbench": 675, "gsm8k": 1319}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    assert main(["--dataset", "all", "--src", str(SHARED), "--out", str(out)]) == 0
    return out


@needs_shared
@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_prepared_rows_and_schema(prepared, name):
    table = pq.read_table(prepared / f"{name}.parquet")
    assert table.num_rows == EXPECTED_ROWS[name]
    assert table.schema.equals(SCHEMA), table.schema
    assert table.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert table.schema.field("extra_info").type.field("index").type == pa.int64()
    rows = table.to_pylist()
    for i, r in enumerate(rows):
        assert r["ability"] == "math"
        assert r["reward_model"]["style"] == "rule"
        gt = r["reward_model"]["ground_truth"]
        assert isinstance(gt, str) and gt.strip() == gt and gt
        assert len(r["prompt"]) == 1 and r["prompt"][0]["role"] == "user"
        assert r["prompt"][0]["content"] == r["extra_info"]["problem"] + JUSTRL_SUFFIX
        assert r["extra_info"]["index"] == i and r["extra_info"]["benchmark"] == name
        assert r["extra_info"]["split"] == ("train" if name == "dapo-math-17k" else "test")
    sources = {r["data_source"] for r in rows}
    assert sources == {"math_dapo" if name == "dapo-math-17k" else name}
    scorer_for(sources.pop())  # routes without raising


@needs_shared
def test_answer_canonicalisation(prepared):
    aime24 = pq.read_table(prepared / "aime24.parquet").to_pylist()
    assert all(not r["reward_model"]["ground_truth"].startswith("0") for r in aime24)  # "025" → "25"
    assert {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"] for r in aime24}["60"] == "204"
    amc = {r["extra_info"]["problem_id"]: r["reward_model"]["ground_truth"]
           for r in pq.read_table(prepared / "amc23.parquet").to_pylist()}
    assert amc["0"] == "27" and "-1" in amc.values()  # floats 27.0 / -1.0
    minerva = pq.read_table(prepared / "minerva.parquet").to_pylist()
    assert minerva[0]["reward_model"]["ground_truth"] == "1.6" and minerva[1]["reward_model"]["ground_truth"] == "4.5e33"
    oly = pq.read_table(prepared / "olympiadbench.parquet").to_pylist()
    assert oly[1]["reward_model"]["ground_truth"] == "\\frac{1}{2 n+2}"  # "$...$" stripped
    gsm = [r["reward_model"]["ground_truth"] for r in pq.read_table(prepared / "gsm8k.parquet").to_pylist()]
    assert gsm[0] == "18" and all("," not in g for g in gsm)


@needs_shared
def test_dapo_dedup(prepared, capsys):
    rows = pq.read_table(prepared / "dapo-math-17k.parquet").to_pylist()
    problems = [" ".join(r["extra_info"]["problem"].split()) for r in rows]
    assert len(set(problems)) == len(problems)
    assert all(r["reward_model"]["ground_truth"].lstrip("-").isdigit() for r in rows)
    assert not any("Remember to put your answer" in p for p in problems)


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
    summary = prepare_dataset("dapo-math-17k", str(tmp_path / "dapo-math-17k.parquet"), tmp_path / "raw", dedup=False)
    assert summary.rows_written == 6 and summary.dropped == {}


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
    with pytest.raises(ValueError, match="max_rows"):
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
    with pytest.raises(DataPrepError, match="not a number"):
        prepare_dataset("aime24", str(aime), tmp_path / "o")
    gsm = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": "a", "answer": "no marker"}])
    with pytest.raises(DataPrepError, match="####"):
        prepare_dataset("gsm8k", str(gsm), tmp_path / "o")
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
