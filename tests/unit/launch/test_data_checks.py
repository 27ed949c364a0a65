"""The data files against what verl and the reward manager read (``stapo_verl.launch.data_checks``), on small files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf

from stapo_verl.data.schema import arrow_schema
from stapo_verl.launch import data_checks as D


def _row(source="math_dapo", question="What is 2+3?", answer="5"):
    return {"data_source": source, "prompt": [{"role": "user", "content": question}], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": "train", "index": 0, "benchmark": source, "problem_id": "0", "source_row": 0,
                           "problem": question}}


def _write(path, rows, drop=()):
    table = pa.Table.from_pylist(rows, schema=arrow_schema())
    table = table.drop_columns(list(drop)) if drop else table
    pq.write_table(table, path)
    return str(path)


def test_a_prepared_file_passes(tmp_path):
    path = _write(tmp_path / "ok.parquet", [_row(), _row("aime24")])
    D.check_schema(path)
    assert D.check_routes(path) == ["aime24", "math_dapo"]


@pytest.mark.parametrize("column", ["reward_model", "prompt", "data_source"])
def test_a_missing_column_is_named_with_the_fix(tmp_path, column):
    path = _write(tmp_path / "bad.parquet", [_row()], drop=[column])
    with pytest.raises(D.DataCheckError, match=rf"bad.parquet has no column '{column}'.*stapo_verl.data.prepare"):
        D.check_schema(path)


def test_reward_model_without_ground_truth_and_a_string_prompt_are_refused(tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"data_source": ["math"], "prompt": [[{"role": "user", "content": "q"}]],
                             "reward_model": [{"style": "rule", "answer": "5"}]}), path)
    with pytest.raises(D.DataCheckError, match="'reward_model' is struct<style: string, answer: string>, needed a "
                                               "struct with a 'ground_truth' field"):
        D.check_schema(path)
    pq.write_table(pa.table({"data_source": ["math"], "prompt": ["q"], "reward_model": [{"ground_truth": "5"}]}), path)
    with pytest.raises(D.DataCheckError, match="column 'prompt' is string, needed a list of {role, content}"):
        D.check_schema(path)


def test_an_unrouted_data_source_is_named(tmp_path):
    path = _write(tmp_path / "s.parquet", [_row(), _row("my_benchmark"), _row("my_benchmark")])
    with pytest.raises(D.DataCheckError, match=r"data_source=\['my_benchmark'\] has no scorer"):
        D.check_routes(path)


def test_overlong_prompts_are_dropped_truncated_as_asked_or_refused():
    lengths = [10, 1000, 40]
    assert D.check_prompt_lengths("f", [10, 40], 100, False, "error") is None
    assert D.check_prompt_lengths("f", lengths, 100, True, "error") == (
        "f: 1 of 3 prompts are longer than data.max_prompt_length=100 tokens (longest 1000): verl's "
        "data.filter_overlong_prompts=True drops them")
    assert "keeps their last 100 tokens (data.truncation=left)" in D.check_prompt_lengths("f", lengths, 100, False,
                                                                                           "left")
    for truncation in ("error", "right", "middle"):
        with pytest.raises(D.DataCheckError, match=r"data.filter_overlong_prompts=True \(drop them\), "
                                                   r"data.max_prompt_length>=1000"):
            D.check_prompt_lengths("f", lengths, 100, False, truncation)


def test_prompt_tokens_are_counted_with_the_chat_template(tmp_path):
    """The count is verl's filter's: the chat template with the generation prompt (ChatML adds its role lines)."""
    from stapo_verl.cpu.make_assets import build_tokenizer, encode_chat

    tok = build_tokenizer(["What is 2+3? " * 20], tmp_path / "tok")
    question = "What is 2+3? " * 50
    path = _write(tmp_path / "p.parquet", [_row(question=question)])
    count = D._token_counter(str(tmp_path / "tok"), {})
    [n] = D.prompt_lengths(path, count)
    assert n == len(encode_chat(tok, question)) > len(tok(question)["input_ids"])
    cfg = OmegaConf.create({"data": {"train_files": [path], "val_files": [], "max_prompt_length": n - 1,
                                     "filter_overlong_prompts": False, "truncation": "error"},
                            "reward": {"custom_reward_function": {"path": D.PROJECT_SCORER}}})
    with pytest.raises(D.DataCheckError, match=f"1 of 1 prompts are longer than data.max_prompt_length={n - 1}"):
        D.check_data(cfg, str(tmp_path / "tok"))
    cfg.data.max_prompt_length = n
    report = D.check_data(cfg, str(tmp_path / "tok"))
    assert report.warnings == () and "data sources ['math_dapo'] routed" in report.detail
