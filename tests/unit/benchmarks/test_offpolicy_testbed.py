"""The second instability testbed's pre-registered criterion and recipe (``benchmarks/offpolicy_testbed.py``): the
false-fail simulation on a flat plateau (<= 5 % at the mean@4 validation's error bound and at twice it, with the
step noise measured in the first testbed's kept runs), its power against a real drop, the accuracy rule on series
built to meet it just or miss it just, the measured noise constants against the kept runs, the sampling error of a
validation dump against its closed form, and the commands (4 mini-batches, mean@4, the planted setting's dumps)."""

import json
import math
import random

import pytest
from support.bench_modules import benchmark_module


@pytest.fixture(scope="module")
def ot():
    with benchmark_module("paired_comparison"), benchmark_module("instability_testbed"), \
            benchmark_module("offpolicy_testbed") as module:
        yield module


def test_a_flat_plateau_fails_at_most_five_percent_of_the_time(ot):
    # the validation's sampling error at mean@4 over 640 rows is at most 0.99 points; the entropy and LM-head norm
    # carry the largest step noise of the first testbed's kept runs
    assert ot.VAL_SE_BOUND == pytest.approx(math.sqrt(0.25 / 2560))
    assert ot.false_fail_rate(ot.VAL_SE_BOUND) <= 0.05
    assert ot.false_fail_rate(2 * ot.VAL_SE_BOUND) <= 0.05  # the mean@1 validation's 2 points
    # every 10 steps as well (11 validation points, not 6)
    assert ot.false_fail_rate(2 * ot.VAL_SE_BOUND, val_freq=10) <= 0.05
    # the first testbed's rule (5 points, mean@1, every 10 steps) on that plateau fails far more often: what was fixed
    rng = random.Random(0)
    first = [ot.tb.instability({s: {ot.tb.VAL_KEY: m[ot.VAL_KEY]} for s, m in
                                ot.plateau_metrics(rng, val_se=2 * ot.VAL_SE_BOUND, val_freq=10).items()
                                if ot.VAL_KEY in m}).failed for _ in range(1000)]
    assert sum(first) / len(first) > 0.10


def test_a_sustained_ten_point_drop_is_detected(ot):
    assert ot.false_fail_rate(ot.VAL_SE_BOUND, drop=0.10, drop_points=3, trials=1000) >= 0.95
    # a drop of 4 points (half the threshold) is not a failure
    assert ot.false_fail_rate(ot.VAL_SE_BOUND, drop=0.04, drop_points=3, trials=1000) <= 0.05


def test_the_accuracy_rule_needs_two_points_eight_below_the_best_after_the_warm_up(ot):
    assert ot.accuracy_onset({0: 0.55, 10: 0.70, 20: 0.72, 30: 0.64, 40: 0.63}) == 30
    assert ot.accuracy_onset({0: 0.55, 10: 0.70, 20: 0.72, 30: 0.65, 40: 0.63}) is None  # 7 points at step 30
    assert ot.accuracy_onset({0: 0.55, 10: 0.70, 20: 0.72, 30: 0.60, 40: 0.71}) is None  # one dip
    assert ot.accuracy_onset({0: 0.80, 10: 0.60, 20: 0.70}) is None  # step 10 is inside the warm-up
    v = ot.verdict({0: {ot.VAL_KEY: 0.7}, 20: {ot.VAL_KEY: 0.6}, 30: {ot.VAL_KEY: 0.6}})
    assert (v.failed, v.onset, v.criteria) == (True, 20, {"accuracy": 20})


def test_the_entropy_rule_smooths_over_five_steps(ot):
    ent = {s: 1.0 - 0.05 * s for s in range(1, 17)}  # 0.2 at step 16; the 5-step mean's minimum 0.3 (steps 12-16)
    # one step at 3x the minimum moves the 5-step mean by 0.08: no rebound
    assert ot.entropy_onset({**ent, 17: 0.6, 18: 0.2, 19: 0.2, 20: 0.2}) is None
    # a sustained rise: the 5-step mean passes 1.5 x 0.3 = 0.45 at step 19 (0.25, 0.2, 0.5, 0.6, 0.75: 0.46)
    rebound = {**ent, 17: 0.5, 18: 0.6, 19: 0.75, 20: 0.7, 21: 0.7}
    assert ot.entropy_onset(rebound) == 19
    v = ot.verdict({s: {ot.pc.ENTROPY_KEY: x} for s, x in rebound.items()})
    assert (v.failed, v.onset, v.criteria) == (True, 19, {"entropy": 19})
    # three steps at 1.75 x the minimum: the first testbed's single-step rule fires, the 5-step mean (0.31 at most)
    # does not
    short = {**ent, 17: 0.35, 18: 0.35, 19: 0.35, 20: 0.2, 21: 0.2}
    assert ot.tb._entropy_onset(short) == 17 and ot.entropy_onset(short) is None


def test_the_noise_constants_are_the_kept_runs(ot):
    got = ot.measured_step_noise()
    assert got["runs"] == 10
    assert got["entropy_log_sd"] == pytest.approx(ot.ENTROPY_LOG_SD, abs=0.0005)
    assert got["lm_head_log_sd"] == pytest.approx(ot.LM_HEAD_LOG_SD, abs=0.0005)


def test_validation_se_is_the_closed_form(ot, tmp_path):
    # two prompts: scores (1, 0, 1, 1) and (0, 0, 0, 1); unbiased variances 0.25 and 0.25, k = 4
    rows = [("a", s) for s in (1, -1, 1, 1)] + [("b", s) for s in (-1, -1, -1, 1)]
    path = tmp_path / "10.jsonl"
    path.write_text("\n".join(json.dumps({"input": i, "output": "", "score": s, "step": 10}) for i, s in rows))
    got = ot.validation_se(path)
    assert got["acc"] == pytest.approx(0.5) and got["prompts"] == 2 and got["k"] == 4
    assert got["se"] == pytest.approx(math.sqrt(0.25 / 4 + 0.25 / 4) / 2)
    path.write_text(json.dumps({"input": "a", "score": 1}))
    with pytest.raises(ValueError, match="fewer than 2 samples"):
        ot.validation_se(path)


def test_the_commands_take_four_mini_batches_and_mean_at_4(ot, tmp_path):
    env, argv = ot.run_command(ot.SETTINGS["mb4_lr5e-5"], "vanilla", 3, tmp_path / "r")
    assert env["VAL_N"] == "4" and "STAPO_ASSETS" not in env
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=4" in argv
    assert argv[-1] == "actor_rollout_ref.actor.optim.lr=5e-5"  # the setting's overrides come last
    assert "trainer.total_training_steps=100" in argv and "data.seed=3" in argv and "trainer.test_freq=20" in argv
    assert {"trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=null"} <= set(argv)  # the counterfactual's
    _, argv = ot.run_command(ot.SETTINGS["mb4_lr5e-5"], "stapo", 3, tmp_path / "s")
    assert "trainer.save_freq=100" in argv and "trainer.max_actor_ckpt_to_keep=null" not in argv
    assert 16 // ot.MINI_BATCH_PROMPTS >= 2  # the tiny recipe's 16 prompts a step: >= 2 optimizer mini-batches
    env, argv = ot.run_command(ot.SETTINGS["planted_mb4_lr2e-4"], "stapo_current", 1, tmp_path / "p",
                               assets=tmp_path / "assets")
    assert env["STAPO_ASSETS"] == str(tmp_path / "assets")
    assert {"trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=null",
            "actor_rollout_ref.actor.policy_loss.dump_tokens=True",
            "actor_rollout_ref.actor.policy_loss.stats_source=current_minibatch"} <= set(argv)
    _, argv = ot.run_command(ot.SETTINGS["planted_mb4_lr2e-4"], "vanilla", 1, tmp_path / "v", assets=tmp_path)
    assert not any("dump_tokens" in x for x in argv)  # the keep-all mask is not an S2T mask


def test_the_table_pairs_arms_with_vanilla(ot):
    def row(failed, acc, clip=0.01, dis=None):
        return {"failed": failed, "onset": 30 if failed else None, "acc_last": acc, "clipfrac": clip,
                "disagreement_share": dis}

    rows = {"vanilla": {1: row(True, 0.5), 2: row(True, 0.6), 3: row(False, 0.7)},
            "stapo_current": {1: row(False, 0.6, dis=0.2), 2: row(False, 0.7, dis=0.4), 3: row(False, 0.8, dis=0.3)}}
    lines = ot.table(rows, ["vanilla", "stapo_current"], [1, 2, 3]).splitlines()
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[:5] == ["stapo_current", "3", "0", "2 / 0 (p = 0.500)", "—, —, —"]
    assert cells[6].startswith("+0.100") and cells[8] == "0.300"
