"""The instability comparison's table in ``docs/results.md`` is what the kept runs give: ``--report`` reads only
``benchmarks/results/instability/lr4e-4/<arm>_seed<s>.json``, so the doc's "whole comparison" table must carry, per
arm, the same failure count, onsets, last-step accuracy interval and paired difference to vanilla that
:func:`instability_testbed.compare_table` computes from those files."""

import json
from pathlib import Path

import pytest
from support.bench_modules import benchmark_module

REPO = Path(__file__).resolve().parents[3]
ARMS = ["vanilla", "stapo", "stapo_paper_tau", "top_entropy", "s2t_random", "s2t_high_entropy"]
SEEDS = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def tb():
    with benchmark_module("paired_comparison"), benchmark_module("instability_testbed") as module:
        yield module


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _norm(cell: str) -> str:
    """The doc writes U+2212 minus, bold and no leading '+' on intervals; the report writes '-' and '+'."""
    return cell.replace("−", "-").replace("**", "").replace("[+", "[").replace(", +0.", ", 0.").strip()


def _doc_rows() -> dict[str, list[str]]:
    text = (REPO / "docs" / "results.md").read_text()
    section = text[text.index("### The whole comparison (30 runs)"):]
    section = section[:section.index("\n### ")]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| arm"):
            cells = _cells(line)
            rows[cells[0].split(" ")[0]] = cells
    return rows


def test_the_docs_table_is_the_kept_runs_report(tb):
    store = tb.STORE
    cand = next(c for c in tb.CANDIDATES if c.name == "lr4e-4")
    cpu = json.loads(tb.stored_path(store, cand, "vanilla", 1).read_text())["cpu"]
    rows = {arm: {s: tb.run_row(cand, s, tb.load_stored(store, cand, arm, s, cpu)["metrics"]) for s in SEEDS}
            for arm in ARMS}
    report = {_cells(line)[0]: _cells(line) for line in tb.compare_table(rows, ARMS, SEEDS).splitlines()[2:]}
    doc = _doc_rows()
    assert sorted(doc) == sorted(ARMS)
    for arm in ARMS:
        got, want = report[arm], doc[arm]
        # seeds, failed, onsets, last-step accuracy (mean, CI), paired difference, best accuracy
        for i in (1, 2, 4, 5, 6, 7):
            assert _norm(want[i]) == _norm(got[i]), (arm, i, want[i], got[i])
        if arm != "vanilla":  # discordant pairs; the doc prints the sign test's p without trailing zeros
            assert want[3].split(" (")[0] == got[3].split(" (")[0], (arm, want[3], got[3])
            assert float(want[3].split("p = ")[1].rstrip(")")) == pytest.approx(float(got[3].split("p = ")[1].rstrip(")")))
