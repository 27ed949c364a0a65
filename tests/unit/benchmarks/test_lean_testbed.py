"""The lean testbed (``benchmarks/lean_testbed.py``): its loss path against the verl path's (the plugin's pre-pass and
``ppo_loss`` on verl's TensorDict) for every arm, the registered run order and its resumption, the claims two
processes share, the J counts, and one short run twice on a tiny model (0 differing values)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support.bench_modules import benchmark_module
from support.verl_batches import as_micro_batch, minibatch, model_output_for, random_minibatch
from verl.utils import tensordict_utils as tu

from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask, ppo_loss


@pytest.fixture(scope="module")
def lt():
    with benchmark_module("tiny_policy"), benchmark_module("paired_comparison"), \
            benchmark_module("instability_testbed"), benchmark_module("offpolicy_testbed"), \
            benchmark_module("lean_testbed") as module:
        yield module


ARMS = ("vanilla", "stapo", "stapo_paper_tau", "s2t_random", "top_entropy")


@pytest.mark.parametrize("arm", ARMS)
def test_the_lean_loss_is_the_verl_paths_loss_and_gradient(lt, arm):
    r = random_minibatch(bs=8, T=9, seed=11)  # no IS weights, no reference: the lean loop has neither
    b = minibatch(r["old"], r["ent"], r["adv"], r["rm"], logp=r["logp"])
    rm = b["rm"]
    setting = lt.SETTINGS["planted_mb4_lr2e-4"]
    # the random batch's low-p tokens sit below both τ_p's
    config, vconfig = lt.actor_config(setting, lt.ARMS[arm], 3), lt.actor_config(setting, lt.ARMS[arm], 3)
    fields = {"old_log_probs": b["old"], "entropy": b["ent"], "advantages": b["adv"], "response_mask": rm}
    keep, metrics = lt.token_mask(config, fields, step=7, mini_batch=2)
    logp = b["logp"].detach().clone().requires_grad_(True)
    loss, _ = lt.pg_loss(config, logp, b["old"], b["adv"], rm, keep)
    loss.backward()
    td = b["td"]
    tu.assign_non_tensor(td, global_steps=7, mini_batch_index=2)
    apply_policy_token_mask(vconfig, td)
    vkeep = td[POLICY_LOSS_MASK_KEY].to_padded_tensor(0).bool()
    w = vkeep.shape[1]
    vlogp = b["logp"].detach().clone().requires_grad_(True)
    mb = as_micro_batch(td, list(range(8)), batch_num_tokens=int(rm.sum()), global_batch_size=8)
    vloss, _ = ppo_loss(vconfig, model_output_for(mb, vlogp), mb)
    vloss.backward()
    assert torch.equal(keep[:, :w], vkeep) and not keep[:, w:].any()
    if arm == "vanilla":
        assert torch.equal(keep, rm)  # keep-all
    else:  # every other arm silences something here, so the renormalisation is exercised
        assert int((rm & ~keep).sum()) > 0
    torch.testing.assert_close(loss.detach(), vloss.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(logp.grad, vlogp.grad, rtol=1e-12, atol=1e-12)


def test_the_arms_carry_the_registered_keys(lt):
    s = lt.SETTINGS["planted_v2_mb4_lr2e-4"]
    got = {a: lt.actor_config(s, lt.ARMS[a], 4).policy_loss for a in lt.ARMS}
    assert got["vanilla"].token_mask == "top_entropy" and got["vanilla"].top_entropy_ratio == 1.0
    assert got["stapo"].s2t_tau_p == 0.1 and got["stapo_paper_tau"].s2t_tau_p == 0.002
    assert got["top_entropy"].top_entropy_ratio == 0.2 and got["s2t_random"].random_mask_seed == 4
    assert got["stapo_current"].stats_source == "current_minibatch"
    assert lt.actor_config(s, lt.ARMS["stapo"], 1).optim.lr == 2e-4
    assert lt.actor_config(lt.SETTINGS["mb4_lr5e-5"], lt.ARMS["stapo"], 1).optim.lr == 5e-5


def test_the_run_order_is_the_registered_one_and_resumes(lt, tmp_path):
    order = lt.run_order()
    assert order[:2] == [("planted_v2_mb4_lr2e-4", "vanilla", 1), ("planted_v2_mb4_lr2e-4", "vanilla", 2)]
    assert order[2:7] == [("mb4_lr5e-5", "vanilla", s) for s in range(1, 6)]
    assert order[7:12] == [("planted_v2_mb4_lr2e-4", a, 1) for a in lt.GRID_ARMS[1:]]
    assert len(order) == len(set(order)) == 5 + 6 * 5
    left, hours = lt.remaining_hours(tmp_path, order)
    assert left == order and hours == pytest.approx((5 * 100 + 30 * 150) / 100 * lt.MINUTES_PER_100_STEPS / 60)
    lt.write_record(lt.result_path(tmp_path, *order[0]), {"metrics": {}})
    left, _ = lt.remaining_hours(tmp_path, order)
    assert left == order[1:]


def test_two_processes_never_claim_the_same_run(lt, tmp_path):
    item = ("mb4_lr5e-5", "vanilla", 3)
    assert lt.claim(tmp_path, item) is True
    assert lt.claim(tmp_path, item) is False
    assert lt.claim(tmp_path, ("mb4_lr5e-5", "vanilla", 4)) is True


def test_j_counts_and_the_mask_summary(lt):
    tp = __import__("tiny_policy")
    j = 5
    # group a: 2 correct (one with two J's), 1 wrong with a J -> mixed; group b: all correct with a J -> not mixed
    responses = torch.tensor([[1, j, 2, j], [1, 2, 3, 0], [j, 1, 0, 0], [j, 1, 1, 1], [2, 2, 2, 2]])
    rm = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    batch = tp.Batch(input_ids=responses, attention_mask=rm.long(), prompt_len=torch.zeros(5, dtype=torch.long),
                     responses=responses, response_mask=rm, scores=torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0]),
                     uid=np.array(["a", "a", "a", "b", "b"], dtype=object))
    silenced = torch.zeros_like(rm)
    silenced[0, 1] = silenced[1, 0] = silenced[3, 0] = True
    c = lt.j_counts(batch, silenced, j)
    assert c == {"j_sampled": 4, "j_positive": 2, "j_positive_silenced": 1, "silenced": 3, "silenced_j": 2,
                 "responses_with_j": 3, "correct_with_j": 2}
    s = lt.mask_summary({1: {f"planted/{k}": v for k, v in c.items()}, 2: {"planted/silenced": 1}})
    assert s["precision"] == pytest.approx(2 / 4) and s["recall"] == pytest.approx(1 / 2)


def test_a_record_round_trips_with_int_steps(lt, tmp_path):
    rec = {"metrics": {0: {"a": 1.0}, 10: {"b": 2.0}}, "planted": {"p_j": {0: {"p_j_clean": 0.1}}, "mask": {}}}
    path = tmp_path / "x" / "vanilla_seed1.json"
    lt.write_record(path, rec)
    back = lt.read_record(path)
    assert back["metrics"] == rec["metrics"] and back["planted"]["p_j"] == rec["planted"]["p_j"]
    assert json.loads(path.read_text())["metrics"]["10"] == {"b": 2.0}


def test_validation_accuracy_and_its_sampling_error(lt, monkeypatch):
    tp = __import__("tiny_policy")
    # 2 prompts x 4 samples: prompt 0 right 3 of 4, prompt 1 right 1 of 4
    scores = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    monkeypatch.setattr(tp, "sample_batch", lambda *a, **k: tp.Batch(*([None] * 5), scores=scores, uid=None))
    v = lt.validate(None, [{}, {}], seed=1, step=0)
    assert v["acc"] == pytest.approx(0.5)
    var = 0.75 * 0.25 * 4 / 3  # unbiased variance of three 1s and one 0 (and of one 1 and three 0s)
    assert v["se"] == pytest.approx(math.sqrt(2 * var / 4) / 2)


def _fake_run(lt, store, arm, seed, val, pj, se=0.01):
    metrics = {s: {lt.VAL_KEY: v, "val/se": se} for s, v in val.items()}
    rec = {"metrics": metrics, "planted": {"p_j": {s: {"p_j_clean": p} for s, p in pj.items()}, "mask": {}}}
    lt.write_record(lt.result_path(store, "planted_mb4_lr2e-4_steps40", arm, seed), rec)


def test_the_40_step_gate_passes_inside_the_seed_spread_and_fails_outside(lt, tmp_path):
    interim = tmp_path / "interim"
    interim.mkdir()
    pj_steps = (10, 20, 30, 40)
    for arm, v20 in (("vanilla", 0.60), ("stapo", 0.40)):
        rows = [{"step": 0, "data": {lt.VAL_KEY: 0.70}}, {"step": 20, "data": {lt.VAL_KEY: v20}},
                {"step": 40, "data": {lt.VAL_KEY: 0.61}}]
        (interim / f"{arm}_seed1.steps0-40.metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        (interim / f"{arm}_seed1.planted_measure.json").write_text(json.dumps(
            {"p_j": {str(s): {"p_j_clean": 0.005} for s in pj_steps}}))
    store = tmp_path / "store"
    for seed, shift in ((1, 0.0), (2, 0.03), (3, -0.03)):
        _fake_run(lt, store, "vanilla", seed, {0: 0.70, 20: 0.62 + shift, 40: 0.63 + shift},
                  {s: 0.005 + shift / 10 for s in pj_steps})
    _fake_run(lt, store, "stapo", 1, {0: 0.70, 20: 0.66, 40: 0.63}, {s: 0.005 for s in pj_steps})
    got = lt.gate(store, interim=interim)
    assert all(r["ok"] for r in got["vanilla"])
    bad = [r for r in got["stapo"] if not r["ok"]]
    # stapo's verl value at step 20 (0.40) is 0.26 below the lean seed 1 and far outside the spread [0.59, 0.65]
    assert [(r["what"], r["step"]) for r in bad] == [("val", 20)]
    assert got["vanilla"][1]["lo"] == pytest.approx(0.59) and got["vanilla"][1]["hi"] == pytest.approx(0.65)


def test_the_paired_table_holds_the_mean_seed_differences_of_the_kept_grid(lt):
    """On the committed planted_v2 grid: each cell is the mean over seeds of arm − vanilla, computed here from the
    records themselves (failures: vanilla 4 of 5, stapo 3 of 5, so −0.2), and precision is the seeds' mean."""
    name, seeds = "planted_v2_mb4_lr2e-4", range(1, 6)
    records = {arm: {s: lt.read_record(lt.result_path(lt.STORE, name, arm, s)) for s in seeds}
               for arm in ("vanilla", "stapo")}

    def last_acc(rec):
        val = {s: m[lt.VAL_KEY] for s, m in rec["metrics"].items() if lt.VAL_KEY in m}
        return val[max(val)]

    cells = lt.paired_table(records, ["vanilla", "stapo"]).splitlines()[2].strip("| ").split(" | ")
    diff = [last_acc(records["stapo"][s]) - last_acc(records["vanilla"][s]) for s in seeds]
    assert cells[:2] == ["stapo", "5"]
    assert cells[2].startswith("-0.200 ")
    assert float(cells[4].split()[0]) == pytest.approx(sum(diff) / 5, abs=5e-4)
    precision = [records["stapo"][s]["planted"]["mask"]["precision"] for s in seeds]
    assert float(cells[7].split()[0]) == pytest.approx(sum(precision) / 5, abs=5e-4)
