"""avg@k, unbiased pass@k, six-benchmark average, the comparison table and the generation records, on hand-computed
examples (the CLI run that scores through the reward workers is in ``tests/integration/rewards/test_eval_cli.py``)."""

from __future__ import annotations

import json
from math import comb

import pytest

from stapo_verl.eval.__main__ import main, parse_runs
from stapo_verl.eval.generate_vllm import DECODING_SETTINGS, MAX_NEW_TOKENS, build_parser, decoding_tag, make_records
from stapo_verl.eval.metrics import SIX_BENCHMARKS, avg_at_k, mean_pass_at_k, pass_at_k
from stapo_verl.eval.records import RecordError, read_records, write_records
from stapo_verl.eval.table import (
    build_gain_table,
    build_table,
    short_problem_notes,
    six_average,
    summarize_run,
    to_markdown,
    write_tables,
)


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k
    assert pass_at_k(32, 4, 32) == 1.0
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - comb(7, 4) / comb(10, 4))
    for bad in [(4, 1, 5), (4, 5, 1), (4, 1, 0)]:
        with pytest.raises(ValueError, match="need 1 <= k <= n"):
            pass_at_k(*bad)


def test_avg_at_k_hand_values():
    assert avg_at_k([[True, False, False, False], [True, True, True, True]]) == pytest.approx((0.25 + 1.0) / 2)
    assert avg_at_k([[True, False], [False, False, False, True]]) == pytest.approx((0.5 + 0.25) / 2)
    assert mean_pass_at_k([[True, False, False, False], [False] * 4], 2) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        avg_at_k([])


def _records(bench, correct_per_problem, k):
    recs = []
    for pid, c in enumerate(correct_per_problem):
        for j in range(k):
            recs.append({"benchmark": bench, "problem_id": str(pid), "sample_index": j, "acc": j < c})
    return recs


def test_summary_table_and_relative_gain():
    # Baseline: every benchmark at 25 %; run B: AIME24 at 50 % (2 problems x 32 samples: 16 + 16 correct), rest 25 %.
    base, better = [], []
    for b in SIX_BENCHMARKS:
        k = 32 if b in ("aime24", "aime25", "amc23") else 4
        base += _records(b, [k // 4, k // 4], k)
        better += _records(b, [k // 2, k // 2] if b == "aime24" else [k // 4, k // 4], k)
    better.append({"benchmark": "aime24", "problem_id": "0", "sample_index": 40, "acc": True})  # beyond k: ignored
    runs = {"A": summarize_run(base), "B": summarize_run(better)}
    assert runs["A"]["aime24"]["avg@k"] == pytest.approx(0.25) and runs["A"]["aime24"]["k"] == 32
    assert runs["B"]["aime24"]["avg@k"] == pytest.approx(0.5) and runs["B"]["aime24"]["samples"] == 64
    assert runs["A"]["math500"]["pass@k"] == 1.0  # k = n = 4, one correct
    assert six_average(runs["A"]) == pytest.approx(0.25)
    assert six_average(runs["B"]) == pytest.approx((0.5 + 5 * 0.25) / 6)
    header, rows = build_table(runs)
    assert header[1] == "aime24 (avg@32)" and header[4] == "math500 (avg@4)" and header[-2] == "Avg (6)"
    assert rows[0][1:] == ["25.00"] * 7 + ["+0.00"]
    assert rows[1][1] == "50.00" and rows[1][-2] == "29.17" and rows[1][-1] == "+16.67"  # (0.29167-0.25)/0.25
    assert to_markdown(header, rows).splitlines()[1].count("---") == len(header)
    gain_header, gain_rows = build_gain_table(runs)
    assert gain_header[1] == "aime24" and gain_rows[0][0] == "B" and gain_rows[0][1] == "+100.00"
    assert gain_rows[0][2] == "+0.00" and gain_rows[0][-1] == "+16.67"


def test_missing_benchmark_gives_no_average():
    runs = {"A": summarize_run(_records("aime24", [8], 32))}
    assert six_average(runs["A"]) is None
    assert build_table(runs)[1][0][-2:] == ["-", "-"]


def test_records_link_to_prepared_parquet(tmp_path):
    from stapo_verl.data.schema import make_row, write_parquet

    pq_path = write_parquet([make_row(data_source="aime25", benchmark="aime25", split="test", index=0, problem="p",
                                      answer="70", problem_id="0", source_row=0)], tmp_path / "aime25.parquet")
    write_records([{"benchmark": "aime25", "problem_id": "0", "sample_index": 0, "response": "\\boxed{70}",
                    "parquet": str(pq_path)}], tmp_path / "g.jsonl")
    assert next(read_records(tmp_path / "g.jsonl"))["ground_truth"] == "70"
    write_records([{"benchmark": "aime25", "problem_id": "9", "sample_index": 0, "response": "",
                    "parquet": str(pq_path)}], tmp_path / "h.jsonl")
    with pytest.raises(RecordError, match="problem_id '9' not in"):
        list(read_records(tmp_path / "h.jsonl"))
    with pytest.raises(RecordError, match="missing keys"):
        write_records([{"benchmark": "x"}], tmp_path / "i.jsonl")
    with pytest.raises(ValueError, match="given twice"):
        parse_runs(["a=x", "a=y"])


def test_generate_vllm_is_importable_without_vllm(tmp_path):
    args = build_parser().parse_args(["--model", "/ckpt", "--data", "a.parquet", "--out", str(tmp_path)])
    assert args.max_new_tokens == MAX_NEW_TOKENS == 20480
    assert args.settings == ["t1.0_p1.0", "t0.7_p0.9"] and DECODING_SETTINGS == ((1.0, 1.0), (0.7, 0.9))
    assert decoding_tag(0.7, 0.9) == "t0.7_p0.9"
    row = {"data_source": "math500", "reward_model": {"ground_truth": "5"},
           "extra_info": {"benchmark": "math500", "problem_id": "test/x/1.json"}}
    recs = list(make_records([row], [["\\boxed{5}", "\\boxed{6}"]], "t1.0_p1.0", "m.parquet"))
    assert [r["sample_index"] for r in recs] == [0, 1] and recs[0]["ground_truth"] == "5"
    assert write_records(recs, tmp_path / "g.jsonl") == 2
    with pytest.raises(ValueError, match="1 rows but 0"):
        list(make_records([row], [], "t", "p"))


def test_each_problem_uses_its_own_n_and_the_table_says_so(tmp_path):
    """3 AIME problems, one with 31 samples: the others keep k = 32 (pass@32 of 1 correct in 32 is 1, not 31/32)."""
    recs = [{"benchmark": "aime24", "problem_id": "0", "sample_index": j, "acc": j == 0} for j in range(32)]
    recs += [{"benchmark": "aime24", "problem_id": "1", "sample_index": j, "acc": j < 2} for j in range(31)]
    recs += [{"benchmark": "aime24", "problem_id": "2", "sample_index": j, "acc": False} for j in range(32)]
    summary = summarize_run(recs)["aime24"]
    # pass_at_k(32, 1, 32) = 1, pass_at_k(31, 2, 31) = 1, pass_at_k(32, 0, 32) = 0; the old shared k = 31 gave
    # (1 - C(31,31)/C(32,31)) = 0.96875 for problem 0, i.e. 65.62 %.
    assert summary["pass@k"] == pytest.approx(2 / 3)
    assert summary["avg@k"] == pytest.approx((1 / 32 + 2 / 31 + 0) / 3)
    assert summary["short_problems"] == 1 and summary["short_problem_n"] == {"1": 31}
    assert build_table({"A": {"aime24": summary}}, "pass@k")[1][0][1] == "66.67"
    notes = short_problem_notes({"A": {"aime24": summary}})
    assert notes == ["A / aime24: 1 of 3 problems with n < k = 32: '1' (n=31); their avg@k uses n samples and "
                     "their pass@k is pass@n"]
    write_tables({"A": {"aime24": summary}}, tmp_path)
    assert "### Problems with fewer than k samples\n\n- " + notes[0] in (tmp_path / "table.md").read_text()
    full = summarize_run(_records("aime24", [1, 0], 32))["aime24"]
    assert full["short_problem_n"] == {} and not short_problem_notes({"A": {"aime24": full}})


def test_duplicate_samples_are_an_error_naming_file_and_line(tmp_path, capsys):
    lines = [{"benchmark": "aime24", "problem_id": "7", "sample_index": j, "response": "\\boxed{1}",
              "ground_truth": "1"} for j in (0, 1)]
    lines.append({**lines[0], "response": "\\boxed{2}"})  # the same sample again, with another answer
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    with pytest.raises(RecordError, match=r"g\.jsonl:3: duplicate record \(benchmark, problem_id, sample_index\) = "
                                          r"\('aime24', '7', 0\); first at line 1"):
        list(read_records(path))
    assert main(["--runs", f"A={path}", "--out", str(tmp_path / "out")]) == 2
    assert "g.jsonl:3: duplicate record" in capsys.readouterr().err
    with pytest.raises(RecordError, match=r"h\.jsonl:3: duplicate record"):
        write_records(lines, tmp_path / "h.jsonl")
    with pytest.raises(ValueError, match=r"duplicate record .* \('aime24', '7', 0\)"):
        summarize_run([{**r, "acc": True} for r in lines])
    bad = tmp_path / "i.jsonl"
    bad.write_text(json.dumps({**lines[0], "sample_index": "0"}) + "\n")
    with pytest.raises(RecordError, match=r"i\.jsonl:1: sample_index must be an integer >= 0, got '0'"):
        list(read_records(bad))
    bad.write_text("[1, 2]\n")
    with pytest.raises(RecordError, match=r"i\.jsonl:1: expected a JSON object, got list"):
        list(read_records(bad))
