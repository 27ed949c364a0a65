"""Collapse early-warning (``stapo_verl.diagnostics.collapse``): the running z-score's numbers and the warning rule."""

import math
import statistics

import pytest

from stapo_verl.diagnostics.collapse import CollapseMonitor, RunningZScore


def test_z_uses_the_previous_window_only_after_the_warmup():
    z = RunningZScore(window=3, warmup=2)
    assert z.update(1.0)[0] is None and z.update(2.0)[0] is None  # warm-up: 0 then 1 previous value
    score, mean, sd, n = z.update(4.0)  # previous: 1, 2
    assert (mean, n) == (1.5, 2) and sd == pytest.approx(statistics.stdev([1.0, 2.0]))
    assert score == pytest.approx((4.0 - 1.5) / sd)
    score, mean, _, n = z.update(0.0)  # previous: 1, 2, 4 (window 3)
    assert (mean, n) == (pytest.approx(7 / 3), 3)
    score, mean, _, n = z.update(5.0)  # previous: 2, 4, 0 — the first value left the window
    assert mean == pytest.approx(2.0) and n == 3
    assert score == pytest.approx((5.0 - 2.0) / statistics.stdev([2.0, 4.0, 0.0]))


def test_flat_history_and_non_finite_values():
    z = RunningZScore(window=5, warmup=2)
    z.update(1.0), z.update(1.0)
    assert z.update(1.0)[0] == 0.0
    assert z.update(2.0)[0] == math.inf
    assert z.update(float("nan"))[0] is None and len(z.history) == 4  # not kept
    with pytest.raises(ValueError, match="warmup"):
        RunningZScore(window=3, warmup=4)


def test_monitor_warns_on_entropy_and_lm_head_and_on_grad_norm_only_without_lm_head():
    mon = CollapseMonitor(window=10, warmup=3, threshold=3.0, log_scale=False)
    for step, h in enumerate([1.00, 1.02, 0.98, 1.01], 1):
        z, lines = mon.observe(step, {"actor/entropy": h, "actor/grad_norm": 1.0 + 0.01 * step}, where="W.")
        assert not lines
    assert set(z) == {"actor/stapo/collapse/entropy_z", "actor/stapo/collapse/grad_norm_z"}
    z, lines = mon.observe(5, {"actor/entropy": 0.5, "actor/grad_norm": 9.0}, where="Dump: /x.")
    assert z["actor/stapo/collapse/entropy_z"] < -3 and z["actor/stapo/collapse/grad_norm_z"] > 3
    assert len(lines) == 2
    assert lines[0].startswith("[stapo] collapse warning at step 5: actor/entropy = 0.5 is ")
    assert "sd below its running mean 1.002 (sd 0.0171, previous 4 steps; threshold 3)" in lines[0]
    assert lines[0].endswith("Dump: /x. No action taken.")
    assert "actor/grad_norm = 9 is" in lines[1] and "above" in lines[1]
    # with the LM-head norm present, the total grad norm is scored but does not warn
    mon = CollapseMonitor(window=10, warmup=2, threshold=3.0, log_scale=False)
    for step, g in enumerate([1.0, 1.1, 0.9], 1):
        mon.observe(step, {"actor/grad_norm": g, "actor/stapo/lm_head_grad_norm": g / 2}, where="")
    z, lines = mon.observe(4, {"actor/grad_norm": 50.0, "actor/stapo/lm_head_grad_norm": 0.5}, where="")
    assert z["actor/stapo/collapse/grad_norm_z"] > 3 and abs(z["actor/stapo/collapse/lm_head_grad_norm_z"]) < 3
    assert lines == []
    # threshold None: z-scores only
    mon = CollapseMonitor(window=10, warmup=2, threshold=None, log_scale=False)
    for step, h in enumerate([1.0, 1.1, 0.0], 1):
        z, lines = mon.observe(step, {"actor/entropy": h}, where="")
    assert z["actor/stapo/collapse/entropy_z"] < -5 and lines == []


def test_saved_windows_continue_exactly():
    """A monitor restored from another's state_dict (JSON round trip) scores the next steps exactly as the one that
    was never interrupted: what a resume from a verl checkpoint needs."""
    import json

    signals = [{"actor/entropy": 0.5 + 0.1 * ((s * 7) % 5), "actor/grad_norm": 1.0 + 0.3 * ((s * 3) % 4)}
               for s in range(12)]
    whole = CollapseMonitor(window=4, warmup=3, threshold=2.0)
    first = CollapseMonitor(window=4, warmup=3, threshold=2.0)
    out_whole = [whole.observe(s, m, where="") for s, m in enumerate(signals)]
    for s, m in enumerate(signals[:6]):
        first.observe(s, m, where="")
    resumed = CollapseMonitor(window=4, warmup=3, threshold=2.0)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert [resumed.observe(s, m, where="") for s, m in enumerate(signals[6:], 6)] == out_whole[6:]
    fresh = CollapseMonitor(window=4, warmup=3, threshold=2.0)
    assert [fresh.observe(s, m, where="") for s, m in enumerate(signals[6:], 6)] != out_whole[6:]
    with pytest.raises(ValueError, match="unknown signal 'x'"):
        resumed.load_state_dict({"x": [1.0]})
    with pytest.raises(ValueError, match="non-finite"):
        resumed.load_state_dict({"actor/entropy": [float("nan")]})


def test_log_scale_scores_the_logs_and_keeps_the_values():
    z = RunningZScore(window=5, warmup=2, log_scale=True)
    for x in (1.0, 2.0, 4.0):
        z.update(x)
    score, mean, sd, n = z.update(64.0)
    logs = [math.log(v) for v in (1.0, 2.0, 4.0)]
    assert n == 3 and mean == pytest.approx(statistics.fmean(logs)) and sd == pytest.approx(statistics.stdev(logs))
    assert score == pytest.approx((math.log(64.0) - statistics.fmean(logs)) / statistics.stdev(logs))
    assert list(z.history) == [1.0, 2.0, 4.0, 64.0]  # a checkpoint keeps the values, as before
    assert z.update(0.0)[0] is None and len(z.history) == 4  # no log of 0: neither scored nor kept
    # scale-free: the same relative change gives the same z at any level of the signal
    a, b = RunningZScore(5, 2, log_scale=True), RunningZScore(5, 2, log_scale=True)
    for x in (1.0, 1.1, 0.9, 1.05):
        a.update(x), b.update(1000 * x)
    assert a.update(3.0)[0] == pytest.approx(b.update(3000.0)[0])


def test_the_defaults_are_quiet_on_healthy_runs_and_warn_on_a_gradient_blow_up():
    """The calibration (``benchmarks/collapse_calibration.py``, docs/diagnostics.md): at the config's defaults the
    monitor prints nothing over the default tiny run and the instability testbed's runs that did not fail, and warns
    at the onset step of the testbed's gradient blow-up (LM-head norm > 5x its recent median at step 19). The old
    defaults (threshold 4, warm-up 5, linear scale) printed lines on both healthy kinds."""
    import dataclasses

    from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig
    from support.bench_modules import benchmark_module

    d = {f.name: f.default for f in dataclasses.fields(StapoPolicyLossConfig)}
    with benchmark_module("collapse_calibration") as cal:
        runs = cal.load_testbed("lr4e-4")
        healthy = [m for m, v in runs.values() if not v.failed] + [cal.load_jsonl(cal.TINY_HEALTHY)]
        assert len(healthy) == 3 and all(len(m) >= 20 for m in healthy)

        def warned(metrics):
            return cal.alarms(metrics, d["collapse_warmup_steps"], d["collapse_z_threshold"], None,
                              d["collapse_window"])

        assert [warned(m) for m in healthy] == [[], [], []]
        blow_up, verdict = runs["stapo_paper_tau_seed5"]
        assert verdict.criteria == {"grad": 19} and warned(blow_up)[:1] == [19]
        assert any(cal.alarms(m, 5, 4.0, False) for m in healthy)  # what the old defaults printed
