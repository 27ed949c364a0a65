"""``benchmarks/bench_series_size.py``: the PR sizes read from ``build_series.py --sizes``' table, and the probe's
count of what a masked job loads (a fresh interpreter, the plugin's entry point)."""

from __future__ import annotations

from support.bench_modules import benchmark_module

SIZES = """| patch (PR) | production .py | production .yaml (+ generated) | tests | docs/examples |
|---|---|---|---|---|
| 0001 side PR (licence header) | +0 / −0 | +0 / −0 (+0 / −0) | +2 / −0 | +0 / −0 |
| 0002 PR A (extension point) | +149 / −15 | +4 / −0 (+4 / −0) | +590 / −0 | +0 / −0 |
| 0003 PR B (STAPO) | +172 / −0 | +6 / −0 (+8 / −0) | +322 / −0 | +73 / −0 |
"""


def test_pr_sizes_are_the_added_production_lines_of_pr_a_and_pr_b():
    with benchmark_module("bench_series_size") as bench:
        assert bench.parse_pr_sizes(SIZES) == {"pr_a": 149, "pr_b": 172}
        assert bench.parse_pr_sizes(SIZES.replace("PR B", "PR C")) == {"pr_a": 149, "pr_b": -1}


def test_the_probe_counts_the_plugins_modules_and_its_wrappers():
    with benchmark_module("bench_series_size") as bench:
        probe = bench.probe()
    from stapo_verl.integration.verl_0_9_1 import PATCHES

    assert probe["ledger"] == len(PATCHES)
    # the shared worker methods and the gate are loaded; the launcher and the CPU platform are not
    assert {"stapo_verl.core.engine_workers", "stapo_verl.integration.verl_0_9_1"} <= set(probe["modules"])
    assert not any(m.startswith(("stapo_verl.launch", "stapo_verl.cpu")) for m in probe["modules"])
    assert "verl.workers.engine_workers.TrainingWorker.train_batch" in probe["wrappers"]
    assert all(n > 0 for n in probe["modules"].values())


def test_a_masked_job_and_the_prs_stay_within_the_limits():
    """The sizes the project set itself (``LIMITS``): lines a masked job loads, ledger entries, wrappers, and the
    committed PR A / PR B production lines; none of the options' modules is loaded by a job that asks for the mask."""
    with benchmark_module("bench_series_size") as bench:
        probe, prs, limits = bench.probe(), bench.pr_sizes(), bench.LIMITS
    got = {"lines": sum(probe["modules"].values()), "ledger": probe["ledger"], "wrappers": len(probe["wrappers"]),
           **prs}
    assert {k: v for k, v in got.items() if not 0 <= v <= limits[k]} == {}, got
    options = ("training_worker", "trainer", "determinism", "opt_in_ledger", "engine_grads", "unsupported")
    loaded = set(probe["modules"])
    assert not {f"stapo_verl.integration.verl_0_9_1.{m}" for m in options} & loaded
    assert not {"stapo_verl.ledger_follow", "stapo_verl.core.lab_masks", "stapo_verl.algo.selections"} & loaded
    assert not any(m.startswith(("stapo_verl.diagnostics", "stapo_verl.minibatch")) for m in loaded)
