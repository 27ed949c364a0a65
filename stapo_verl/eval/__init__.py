"""Evaluation: avg@k / pass@k per benchmark and paper-style tables (``python -m stapo_verl.eval``), with the
protocol of the STAPO paper (https://arxiv.org/abs/2602.15620)."""

from stapo_verl.eval.metrics import K_BY_BENCHMARK, SIX_BENCHMARKS, avg_at_k, mean_pass_at_k, pass_at_k
from stapo_verl.eval.records import RecordError, read_records, write_records
from stapo_verl.eval.table import build_gain_table, build_table, six_average, summarize_run, to_markdown, write_tables

__all__ = [
    "K_BY_BENCHMARK", "SIX_BENCHMARKS", "RecordError", "avg_at_k", "build_gain_table", "build_table", "mean_pass_at_k", "pass_at_k",
    "read_records", "six_average", "summarize_run", "to_markdown", "write_records", "write_tables",
]
