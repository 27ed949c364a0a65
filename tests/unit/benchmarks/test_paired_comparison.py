"""The paired-comparison benchmark's plumbing (``benchmarks/paired_comparison.py``): the commands it runs (seeds equal
across arms, the arms' deltas), how it reads a run's metrics, and the collapse / spike counts it derives from them."""

import json
import math
import sys
from pathlib import Path

import pytest
from support.bench_modules import benchmark_module

from stapo_verl.diagnostics.collapse import CollapseMonitor

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def pc():
    with benchmark_module("paired_comparison") as module:
        yield module


def test_every_seed_key_is_set_and_equal_across_arms(pc, tmp_path):
    cmds = {}
    for name in ("vanilla", "stapo", "top_entropy", "grpo"):
        env, cmd = pc.run_command(pc.ARMS[name], 3, tmp_path / name, steps=20, test_freq=10, val_before_train=False,
                                  val_max_samples=None, extra=["trainer.logger=[console,file]"])
        cmds[name] = (env, cmd)
        assert cmd[:4] == ["bash", str(ROOT / "recipes" / "run.sh"), "tiny", pc.ARMS[name].method]
        assert env["STAPO_RUN_DIR"] == str(tmp_path / name)
        assert cmd[-1] == "trainer.logger=[console,file]"  # user overrides last: they win
        for key in ("data.seed", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.actor.fsdp_config.seed",
                    "actor_rollout_ref.ref.fsdp_config.seed", "actor_rollout_ref.actor.data_loader_seed"):
            assert f"{key}=3" in cmd
        assert "trainer.total_training_steps=20" in cmd and "trainer.save_freq=20" in cmd
    assert cmds["vanilla"][0]["TOP_ENTROPY_RATIO"] == "1.0"  # the keep-all mask: vanilla's PG term
    assert cmds["top_entropy"][0]["TOP_ENTROPY_RATIO"] == "0.2"
    assert "++actor_rollout_ref.actor.policy_loss.top_entropy_ratio=1.0" in cmds["grpo"][1]
    seeds = {name: [c for c in cmd if "seed" in c] for name, (_, cmd) in cmds.items()}
    assert len({tuple(v) for v in seeds.values()}) == 1


def test_dry_prints_one_command_per_seed_and_arm(pc, capsys, tmp_path):
    assert pc.main(["--dry", "--seeds", "2", "--first-seed", "7", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6
    assert "seed7/vanilla" in lines[0] and "trainer.val_before_train=True" in lines[0]
    assert "seed7/stapo" in lines[1] and "trainer.val_before_train=False" in lines[1]
    assert "seed8/top_entropy" in lines[5] and "data.seed=8" in lines[5]


def test_read_metrics_merges_lines_of_one_step(pc, tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"step": 0, "data": {pc.VAL_KEY: 0.5}},
        {"step": 1, "data": {"actor/entropy": 0.7}},
        {"step": 2, "data": {"actor/entropy": 0.6}},
        {"step": 2, "data": {pc.VAL_KEY: 0.55}},
    ]) + "\n")
    assert pc.read_metrics(path) == {0: {pc.VAL_KEY: 0.5}, 1: {"actor/entropy": 0.7},
                                     2: {"actor/entropy": 0.6, pc.VAL_KEY: 0.55}}


def test_collapse_events_agree_with_the_plugins_monitor(pc):
    entropy = [0.70, 0.69, 0.70, 0.71, 0.70, 0.69, 0.70, 0.40, 0.70, 0.69]
    lm = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 3.0, 1.0]
    monitor = CollapseMonitor(window=pc.COLLAPSE_WINDOW, warmup=pc.COLLAPSE_WARMUP, threshold=pc.COLLAPSE_Z)
    warned = []
    for step, (e, g) in enumerate(zip(entropy, lm), 1):
        _, lines = monitor.observe(step, {"actor/entropy": e, pc.LM_HEAD_KEY: g, "actor/grad_norm": g}, where="")
        warned += [step] * len(lines)
    ours = [i + 1 for i in pc.collapse_events(entropy)] + [i + 1 for i in pc.collapse_events(lm)]
    assert sorted(ours) == warned == [8, 9]
    assert pc.collapse_events(lm, threshold=3.0, upward_only=True) == [8]
    assert pc.collapse_events([-x for x in lm], threshold=3.0, upward_only=True) == []


def test_summarize_run(pc):
    metrics = {0: {pc.VAL_KEY: 0.5}}
    for s in range(1, 21):
        metrics[s] = {"actor/entropy": 0.7 * 0.9 ** s, pc.LM_HEAD_KEY: 1.0 + 0.01 * (s % 3), "actor/grad_norm": 1.0,
                      "critic/score/mean": 0.1, "response_length/mean": 22.0}
    metrics[12][pc.LM_HEAD_KEY] = 5.0
    metrics[10][pc.VAL_KEY] = 0.6
    metrics[20][pc.VAL_KEY] = 0.7
    r = pc.summarize_run(metrics, 20, spike_z=3.0)
    assert r["steps_done"] == 20 and r["val_acc_final"] == 0.7 and r["val_acc_10"] == 0.6 and r["val_acc_0"] == 0.5
    assert r["entropy_last_over_first"] == pytest.approx(0.9 ** 19)
    assert r["lm_head_spikes"] == 1 and r["collapse_warnings"] == 1  # the LM-head jump; the smooth decay: none
    assert r["lm_head_peak_over_median"] == pytest.approx(5.0 / 1.01)
    assert r["step1"] == [0.1, 22.0, pytest.approx(0.63)]
    assert math.isnan(pc.summarize_run({1: {"actor/entropy": 0.5}}, 20, 3.0)["lm_head_spikes"])


def test_comparison_table_pairs_by_seed(pc):
    results = {}
    for s, (a, b) in zip((1, 2, 3), ((0.60, 0.64), (0.70, 0.71), (0.65, 0.70))):
        for arm, v in (("vanilla", a), ("stapo", b)):
            results[f"{s}/{arm}"] = {"val_acc_final": v, "val_acc_10": math.nan, "entropy": {1: 0.7, 2: 0.5},
                                     "entropy_last_over_first": 0.5 / 0.7, "collapse_warnings": 0,
                                     "lm_head_spikes": 0, "lm_head_peak_over_median": 1.2, "garbage_rate": 0.001}
    text = pc.comparison_table(results, ["vanilla", "stapo"], [1, 2, 3], 2, {})
    row = next(line for line in text.splitlines() if line.startswith("| validation accuracy, last step"))
    from stapo_verl.diagnostics.paired import paired_difference

    expected = paired_difference([0.60, 0.70, 0.65], [0.64, 0.71, 0.70]).format(3)
    assert row.endswith(f"| {expected} |") and "+0.033 [" in expected
