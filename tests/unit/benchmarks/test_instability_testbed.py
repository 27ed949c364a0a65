"""The instability testbed's pre-registered failure criterion (``benchmarks/instability_testbed.py``): each of the
three criteria on series built to meet it just, miss it just, or meet it inside the warm-up; the onset it reports;
and the search's commands (the paired comparison's vanilla arm with the candidate's overrides last)."""

import pytest
from support.bench_modules import benchmark_module


@pytest.fixture(scope="module")
def tb():
    with benchmark_module("paired_comparison"), benchmark_module("instability_testbed") as module:
        yield module


def _metrics(tb, val=None, ent=None, lm=None):
    out = {}
    for key, series in ((tb.VAL_KEY, val), (tb.ENTROPY_KEY, ent), (tb.LM_HEAD_KEY, lm)):
        for step, value in (series or {}).items():
            out.setdefault(step, {})[key] = value
    return out


def _falling_entropy(steps=30):
    return {s: 0.6 * 0.9 ** s for s in range(1, steps + 1)}


def test_a_run_that_learns_does_not_fail(tb):
    v = tb.instability(_metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.74, 30: 0.76}, ent=_falling_entropy(),
                                lm={s: 1.0 + 0.1 * (s % 3) for s in range(1, 31)}))
    assert v == tb.Verdict(False, None, {})


def test_accuracy_collapse_needs_two_consecutive_points_after_the_warm_up(tb):
    # 0.66 and 0.65 are 6 and 7 points below the best 0.72: onset at the first of the two
    v = tb.instability(_metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.72, 30: 0.66, 40: 0.65}))
    assert (v.failed, v.onset, v.criteria) == (True, 30, {"accuracy": 30})
    # one dip, then back: no failure
    assert not tb.instability(_metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.72, 30: 0.66, 40: 0.71})).failed
    # 4 points below twice: no failure
    assert not tb.instability(_metrics(tb, val={0: 0.55, 20: 0.72, 30: 0.68, 40: 0.68})).failed
    # the drop at step 10 is inside the warm-up, so step 20 alone is one point: no failure
    assert not tb.instability(_metrics(tb, val={0: 0.60, 10: 0.50, 20: 0.50})).failed


def test_entropy_rebound_needs_three_steps_at_one_and_a_half_times_the_minimum(tb):
    ent = {s: 1.0 - 0.05 * s for s in range(1, 17)}  # 0.2 at step 16
    rebound = {**ent, 17: 0.31, 18: 0.32, 19: 0.35, 20: 0.2}
    v = tb.instability(_metrics(tb, ent=rebound))
    assert (v.failed, v.onset, v.criteria) == (True, 17, {"entropy": 17})
    assert not tb.instability(_metrics(tb, ent={**ent, 17: 0.31, 18: 0.32, 19: 0.25})).failed  # two steps only
    assert not tb.instability(_metrics(tb, ent={**ent, 17: 0.29, 18: 0.29, 19: 0.29})).failed  # 1.45x


def test_gradient_blow_up_against_the_median_of_the_previous_ten_steps(tb):
    flat = {s: 1.0 for s in range(1, 21)}
    v = tb.instability(_metrics(tb, lm={**flat, 21: 5.1}))
    assert (v.failed, v.onset, v.criteria) == (True, 21, {"grad": 21})
    assert not tb.instability(_metrics(tb, lm={**flat, 21: 4.9})).failed
    assert tb.instability(_metrics(tb, lm={s: 1.0 for s in range(1, 11)} | {11: 6.0})).onset == 11  # first judged
    assert not tb.instability(_metrics(tb, lm={s: 1.0 for s in range(1, 10)} | {10: 50.0})).failed  # warm-up


def test_several_criteria_report_the_earliest_onset_and_each_criterion(tb):
    v = tb.instability(_metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.72, 30: 0.60, 40: 0.60},
                                lm={s: 1.0 for s in range(1, 25)} | {25: 9.0}))
    assert (v.failed, v.onset, v.criteria) == (True, 25, {"accuracy": 30, "grad": 25})


def test_search_runs_the_vanilla_arm_with_the_candidates_overrides_last(tb, tmp_path):
    plan = tb.search_plan(tmp_path, ["lr4e-4_clip0.4"], [1, 2])
    assert [(c.name, s, d) for c, s, d, _, _ in plan] == [
        ("lr4e-4_clip0.4", s, tmp_path / "lr4e-4_clip0.4" / f"seed{s}" / "vanilla") for s in (1, 2)]
    for cand, s, run_dir, env, argv in plan:
        assert argv[3] == "top_entropy" and env["TOP_ENTROPY_RATIO"] == "1.0"  # vanilla = the keep-all mask
        assert argv[-2:] == ["actor_rollout_ref.actor.optim.lr=4e-4", "actor_rollout_ref.actor.clip_ratio_high=0.4"]
        assert f"data.seed={s}" in argv and "trainer.total_training_steps=100" in argv
        assert "trainer.test_freq=10" in argv and "trainer.val_before_train=True" in argv


def test_confirmation_needs_three_of_five_failed_seeds_and_says_when_that_is_out_of_reach(tb):
    rows = lambda *failed: [{"failed": f} for f in failed]  # noqa: E731
    assert (tb.CONFIRM_SEEDS, tb.CONFIRM_FAILS) == (5, 3)
    assert tb.confirm_verdict(rows(True, True, True)) == "testbed"
    assert tb.confirm_verdict(rows(True, True, False, False, True)) == "testbed"
    assert tb.confirm_verdict(rows(True, True, False, False)) == "open"
    assert tb.confirm_verdict(rows(True, False, False, False)) == "not a testbed"
    assert tb.confirm_verdict(rows(True, True, False, False, False)) == "not a testbed"


def test_the_sign_test_is_exact_and_two_sided(tb):
    assert tb.sign_test(0, 0) == 1.0
    assert tb.sign_test(5, 0) == tb.sign_test(0, 5) == 2 / 32  # 2 * (1/2)^5
    assert tb.sign_test(4, 1) == 2 * 6 / 32 and tb.sign_test(3, 3) == 1.0


def test_the_comparison_pairs_each_arm_with_vanilla_by_seed(tb):
    def row(failed, onset, last, best):
        return {"failed": failed, "onset": onset, "acc_last": last, "acc_best": best}

    rows = {"vanilla": {1: row(True, 20, 0.45, 0.68), 2: row(True, 30, 0.60, 0.60), 3: row(False, None, 0.70, 0.72)},
            "stapo": {1: row(False, None, 0.65, 0.70), 2: row(True, 40, 0.50, 0.62)}}
    table = tb.compare_table(rows, ["vanilla", "stapo"], [1, 2, 3]).splitlines()
    vanilla, stapo = table[2].split(" | "), table[3].split(" | ")
    assert vanilla[1:4] == ["3", "2", "—"] and vanilla[4] == "20, 30, —"
    # seed 1: vanilla failed, STAPO not; seed 2 both failed; seed 3 not run for STAPO (left out of the pairs)
    assert stapo[1:4] == ["2", "1", "1 / 0 (p = 1.000)"] and stapo[4] == "—, 40"
    assert stapo[6].startswith("+0.050")  # paired: (0.65 - 0.45 + 0.50 - 0.60) / 2


def test_the_comparison_runs_vanilla_first_in_the_searchs_directories(tb, tmp_path):
    cand = next(c for c in tb.CANDIDATES if c.name == "lr4e-4")
    plan = tb.compare_plan(tmp_path, cand, ["vanilla", "stapo_paper_tau"], [1, 2])
    assert [(a, s) for a, s, *_ in plan] == [("vanilla", 1), ("vanilla", 2), ("stapo_paper_tau", 1),
                                              ("stapo_paper_tau", 2)]
    assert plan[0][2] == tb.search_plan(tmp_path, ["lr4e-4"], [1])[0][2]  # the search's run is reused
    argv = plan[2][4]
    assert argv[3] == "stapo" and argv.index("actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.002") < argv.index(
        "actor_rollout_ref.actor.optim.lr=4e-4")


def test_the_comparison_figures_are_written_per_arm_into_a_directory_made_for_them(tb, tmp_path):
    # --report --out DIR writes the figures of kept runs, so DIR may not exist yet (no run created it)
    rows = {"vanilla": {1: {"val": {0: 0.5, 10: 0.6}, "entropy": {1: 0.5, 2: 0.4}}},
            "stapo": {1: {"val": {0: 0.5, 10: 0.7}, "entropy": {1: 0.5, 2: 0.45}}}, "top_entropy": {}}
    paths = tb.compare_figures(rows, ["vanilla", "stapo", "top_entropy"], tmp_path / "report", "compare_x")
    assert [p.name for p in paths] == ["compare_x_val_accuracy.png", "compare_x_entropy.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_the_secondary_measures_count_warnings_before_the_onset_and_the_silenced_share(tb):
    cand = next(c for c in tb.CANDIDATES if c.name == "lr4e-4")
    z_lm, z_ent = tb.COLLAPSE_Z_KEYS[2], tb.COLLAPSE_Z_KEYS[0]
    # accuracy collapse at 30 (two points 6 and 7 below the best); warnings at 22 (lm-head z 4.5) and 35 (entropy
    # z -5); z = 4.0 exactly does not fire (the plugin warns at |z| > 4); the share is logged at 3 steps
    metrics = _metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.72, 30: 0.66, 40: 0.65})
    for step, key, z in ((15, z_lm, 4.0), (22, z_lm, 4.5), (35, z_ent, -5.0)):
        metrics.setdefault(step, {})[key] = z
    for step, share in ((1, 0.1), (2, 0.2), (3, 0.6)):
        metrics.setdefault(step, {})[tb.GRAD_SHARE_KEY] = share
    row = tb.run_row(cand, 1, metrics)
    assert (row["warnings"], row["warnings_before_onset"], row["lead"]) == ([22, 35], 1, 8)
    assert row["grad_share_mean"] == pytest.approx(0.3)
    quiet = tb.run_row(cand, 2, _metrics(tb, val={0: 0.55, 10: 0.70, 20: 0.74}))
    assert (quiet["warnings"], quiet["lead"], quiet["grad_share_mean"]) == ([], None, None)
    table = tb.secondary_table({"stapo": {1: row, 2: quiet}}, ["vanilla", "stapo"], [1, 2]).splitlines()
    assert len(table) == 3  # vanilla has no runs: no line
    assert table[2].split(" | ")[2:] == ["1 of 2", "1 of 1 (8)", "0.3000", "— |"]
    # the p < 1e-4 rate at the last checkpoint: the mean over the runs that have one
    rows = {"stapo": {1: {**row, "garbage_rate": 2e-4}, 2: {**quiet, "garbage_rate": 4e-4}, 3: {**quiet}}}
    table = tb.secondary_table(rows, ["stapo"], [1, 2, 3]).splitlines()
    assert table[2].split(" | ")[-1] == "3.00e-04 (2) |"


INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: ignored
"""


def test_the_cpu_type_names_the_model_and_the_kernel_flags(tb):
    assert tb.cpu_type(INTEL) == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz family 6 model 143 avx2 avx512f " \
                                 "avx512_bf16 amx_bf16"
    amd = INTEL.replace("amx_bf16 amx_tile", "").replace("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "AMD EPYC")
    assert tb.cpu_type(amd.replace("\t: 6", "\t: 25").replace("143", "17")) == \
        "AMD EPYC family 25 model 17 avx2 avx512f avx512_bf16"


def test_a_kept_run_is_reused_only_on_its_cpu_type_and_a_rerun_counts_the_values_that_differ(tb, tmp_path):
    cand = next(c for c in tb.CANDIDATES if c.name == "lr4e-4")
    metrics = _metrics(tb, val={0: 0.55, 10: 0.70}, ent={1: 0.5, 2: 0.4}, lm={1: 1.0, 2: 1.5})
    metrics[1].update({"timing_s/step": 9.0, "actor/pg_loss": 0.25, tb.GRAD_SHARE_KEY: 0.1})
    path = tb.store_run(tmp_path, cand, "stapo", 3, metrics, "cpu A", {"rate": 0.001, "tokens": 1000})
    assert path == tmp_path / "lr4e-4" / "stapo_seed3.json"
    assert tb.load_stored(tmp_path, cand, "stapo", 3, "cpu B") is None  # another CPU type: not the same run
    assert tb.load_stored(tmp_path, cand, "stapo", 4, "cpu A") is None
    kept = tb.load_stored(tmp_path, cand, "stapo", 3, "cpu A")
    assert kept["garbage_rate"] == {"rate": 0.001, "tokens": 1000}
    # the tables' keys are kept (the loss is not), and the row computed from them equals the full run's
    assert kept["metrics"][1] == {tb.ENTROPY_KEY: 0.5, tb.LM_HEAD_KEY: 1.0, tb.GRAD_SHARE_KEY: 0.1}
    assert tb.run_row(cand, 3, kept["metrics"]) == tb.run_row(cand, 3, metrics)
    # time is not part of the digest; a loss is
    slower = {s: dict(m) for s, m in metrics.items()}
    slower[1]["timing_s/step"] = 12.0
    assert tb.metrics_digest(slower) == kept["digest"]
    slower[1]["actor/pg_loss"] = 0.26
    assert tb.metrics_digest(slower) != kept["digest"]
    assert tb.differing_values(kept["metrics"], metrics) == (0, 7)
    changed = {s: dict(m) for s, m in metrics.items()}
    changed[2][tb.ENTROPY_KEY] = 0.41
    del changed[10]
    assert tb.differing_values(kept["metrics"], changed) == (2, 7)


def test_the_last_checkpoints_rate_is_cached_and_none_without_a_checkpoint(tb, tmp_path):
    assert tb.last_checkpoint_garbage(tmp_path, tmp_path / "assets", seed=1, steps=100, prompts=8) is None
    (tmp_path / "garbage_rate.json").write_text('{"rate": 0.002, "tokens": 500}')
    assert tb.last_checkpoint_garbage(tmp_path, tmp_path / "assets", seed=1, steps=100, prompts=8) == \
        {"rate": 0.002, "tokens": 500}


def test_a_finished_run_is_kept_at_once_and_replaced_when_a_rerun_differs(tb, tmp_path, capsys):
    import argparse
    import json

    cand = tb.Candidate("short", 2)
    run_dir, store = tmp_path / "run", tmp_path / "store"
    a = argparse.Namespace(assets=tmp_path / "assets", garbage_prompts=8)
    assert tb.keep_finished(a, store, cand, "stapo", 1, run_dir, "cpu A") is None  # not run, not kept
    run_dir.mkdir()
    (run_dir / "wall.json").write_text('{"returncode": 0}')
    lines = [{"step": 1, "data": {tb.ENTROPY_KEY: 0.5, "actor/pg_loss": 0.1}},
             {"step": 2, "data": {tb.ENTROPY_KEY: 0.4}}]
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    kept = tb.keep_finished(a, store, cand, "stapo", 1, run_dir, "cpu A")
    assert kept["metrics"] == {1: {tb.ENTROPY_KEY: 0.5}, 2: {tb.ENTROPY_KEY: 0.4}} and kept["garbage_rate"] is None
    lines[0]["data"]["actor/pg_loss"] = 0.2
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert tb.keep_finished(a, store, cand, "stapo", 1, run_dir, "cpu A")["digest"] != kept["digest"]
    assert "differ from the kept run's" in capsys.readouterr().out


def test_a_rerun_runs_its_command_in_its_own_directory(tb, tmp_path, capsys):
    # the command names its run directory (STAPO_RUN_DIR); a rerun that kept the comparison's directory in the
    # command wrote its metrics there and then read an empty OUT/rerun/... (every kept value "differed")
    cand = next(c for c in tb.CANDIDATES if c.name == "lr4e-4")
    store, out = tmp_path / "store", tmp_path / "out"
    argv = ["--compare", "lr4e-4", "--rerun", "s2t_random:4", "--dry", "--store", str(store), "--out", str(out)]
    with pytest.raises(SystemExit, match="no run kept of that arm and seed"):
        tb.main(argv)
    tb.store_run(store, cand, "s2t_random", 4, _metrics(tb, val={0: 0.5}), tb.cpu_type())
    assert tb.main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert f"STAPO_RUN_DIR={out / 'rerun' / 'lr4e-4' / 'seed4' / 's2t_random'} " in printed[0]
    assert " tiny stapo_random data.seed=4 " in printed[0]  # the kept run's own arm and seed
    assert str(out / "lr4e-4") not in printed[0]
