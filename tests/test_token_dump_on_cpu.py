"""The silenced-token dump (``stapo_verl.token_dump`` + the worker hook's ``dump_minibatch_tokens``), in-process.

End-to-end rows through verl's real TrainingWorker are checked in ``test_current_minibatch_on_cpu.py``.
"""

import json

import pytest
import torch
from tensordict import TensorDict
from verl.utils.metric import AggregationType, Metric

from stapo_verl import state, token_dump
from stapo_verl.config import StapoConfigError, StapoPolicyLossConfig
from stapo_verl.worker_hooks import _fix_nonfinite_metric, _global_step, apply_s2t_to_minibatch, dump_minibatch_tokens


class CountingTokenizer:
    """decode(ids) → 't<id>' joined by spaces; counts the ids it decodes (cost check)."""

    def __init__(self):
        self.decoded = 0

    def decode(self, ids):
        self.decoded += len(ids)
        return " ".join(f"t{i}" for i in ids)


def test_dump_dir_resolution_and_unusable_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "run" / "metrics.jsonl"))
    assert token_dump.resolve_dump_dir("") == str(tmp_path / "run")
    assert token_dump.resolve_dump_dir(str(tmp_path / "x")) == str(tmp_path / "x")
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH")
    monkeypatch.chdir(tmp_path)
    assert token_dump.resolve_dump_dir("") == str(tmp_path / "stapo_tokens")
    assert token_dump.dump_path("", 3) == str(tmp_path / "stapo_tokens" / "stapo_tokens.dp3.jsonl")
    (tmp_path / "file").write_text("")
    with pytest.raises(StapoConfigError, match=r"policy_loss\.dump_dir=.*cannot be created"):
        token_dump.dump_path(str(tmp_path / "file" / "sub"), 0)


def test_select_rows_silenced_first_equal_size_contrast_and_budget():
    sil = torch.zeros(4, 10, dtype=torch.bool)
    sil[0, 1] = sil[2, 3] = sil[3, 9] = True
    kept = torch.zeros(4, 10, dtype=torch.bool)
    kept[1, :] = True
    g = torch.Generator().manual_seed(0)
    s, k = token_dump.select_rows(sil, kept, 100, g)
    assert s.tolist() == [[0, 1], [2, 3], [3, 9]] and k.shape == (3, 2) and bool(kept[k[:, 0], k[:, 1]].all())
    s, k = token_dump.select_rows(sil, kept, 4, g)
    assert s.shape[0] == 3 and k.shape[0] == 1
    s, k = token_dump.select_rows(sil, kept, 2, g)
    assert s.shape[0] == 2 and k.shape[0] == 0 and bool(sil[s[:, 0], s[:, 1]].all())
    # the contrast sample is uniform over the kept candidates (each of the 10 drawn ≈ 3/10 of the time)
    hits = torch.zeros(10)
    for seed in range(2000):
        _, k = token_dump.select_rows(sil, kept, 100, torch.Generator().manual_seed(seed))
        hits[k[:, 1]] += 1
    assert hits.sum() == 6000 and (hits / 2000 - 0.3).abs().max() < 0.05


def test_context_window_is_8_tokens_each_side_with_the_token_wrapped():
    tok = CountingTokenizer()
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    td = TensorDict({"responses": nest([torch.arange(100, 130), torch.arange(200, 203)])}, batch_size=[2])
    get = token_dump.response_id_getter(td, torch.tensor([[1] * 30, [1] * 3 + [0] * 27], dtype=torch.bool))
    t, ctx = token_dump.context_strings(tok, get(0, 2, 19), 8)
    assert t == "t110" and ctx == " ".join(f"t{i}" for i in range(102, 110)) + "⟦t110⟧" + " ".join(
        f"t{i}" for i in range(111, 119))
    t, ctx = token_dump.context_strings(tok, get(0, 0, 9), 0)
    assert ctx == "⟦t100⟧" + " ".join(f"t{i}" for i in range(101, 109))
    assert get(1, 0, 9) == [200, 201, 202]  # clipped at the response end


def test_response_ids_from_nested_padded_or_input_ids():
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    valid = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    td = TensorDict({"responses": nest([torch.tensor([5, 6, 7]), torch.tensor([8, 9])])}, batch_size=[2])
    assert token_dump.response_id_getter(td, valid)(1, 0, 9) == [8, 9]
    td = TensorDict({"responses": torch.tensor([[5, 6, 7], [8, 9, 0]])}, batch_size=[2])
    assert token_dump.response_id_getter(td, valid)(1, 0, 9) == [8, 9]
    assert token_dump.response_id_getter(td, valid)(0, 1, 2) == [6]
    td = TensorDict({"input_ids": nest([torch.tensor([1, 2, 5, 6, 7]), torch.tensor([3, 8, 9])])}, batch_size=[2])
    assert token_dump.response_id_getter(td, valid)(0, 0, 9) == [5, 6, 7]
    assert token_dump.response_id_getter(td, valid)(1, 1, 9) == [9]
    with pytest.raises(KeyError, match="responses"):
        token_dump.response_id_getter(TensorDict({}, batch_size=[2]), valid)


def _minibatch(bs=6, T=50, n_spurious=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = torch.full((bs, T), -0.1)
    ent = torch.rand(bs, T, generator=g) + 1.0
    idx = torch.randperm(bs * T, generator=g)[: 4 * n_spurious]
    lp.view(-1)[idx] = -9.0  # candidates (p ≈ 1.2e-4 < τ_p)
    ent.view(-1)[idx[:n_spurious]] = 0.01  # the lowest-entropy candidates: silenced
    td = TensorDict({"old_log_probs": lp, "entropy": ent, "advantages": torch.ones(bs, T),
                     "response_mask": torch.ones(bs, T, dtype=torch.int64),
                     "responses": torch.randint(0, 1000, (bs, T), generator=g)}, batch_size=[bs])
    return td


def test_dump_rows_are_exact_and_decoding_is_proportional_to_dumped_rows(tmp_path):
    pl = StapoPolicyLossConfig(loss_mode="stapo", entropy_quantile=0.25, dump_tokens=True, dump_dir=str(tmp_path),
                               dump_max_rows_per_step=256)
    td = _minibatch()
    stats, keep, lp, ent, adv, valid = apply_s2t_to_minibatch(td, pl, None, return_inputs=True)
    assert stats.n_masked == 3 and stats.n_candidates == 12
    state.STEP.global_step, state.STEP.minibatch, state.STEP.rows_dumped = 5, 1, 0
    tok = CountingTokenizer()
    n = dump_minibatch_tokens(td, pl, stats, (keep, lp, ent, adv, valid), tokenizer=tok, dp_rank=2)
    assert n == 6 and state.STEP.rows_dumped == 6
    # 3 decodes per row (token, left, right), each ≤ 8 ids + 1: O(rows), independent of the 300 tokens
    assert tok.decoded <= 6 * 17
    rows = [json.loads(x) for x in (tmp_path / "stapo_tokens.dp2.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["silenced"] * 3 + ["kept"] * 3
    for r in rows:
        assert tuple(r) == token_dump.SCHEMA
        i, t = r["sample_index"], r["position"]
        assert r["token_id"] == int(td["responses"][i, t]) and r["token"] == f"t{r['token_id']}"
        assert r["p"] == pytest.approx(float(torch.tensor(-9.0).double().exp()))
        assert r["entropy"] == pytest.approx(float(ent[i, t])) and r["advantage"] == 1.0
        assert bool(keep[i, t]) == (r["kind"] == "kept")
        assert (r["step"], r["minibatch"], r["dp_rank"], r["tau_p"]) == (5, 1, 2, 0.002)
        assert r["tau_h"] == pytest.approx(stats.tau_h) and r["stats_source"] == "old_policy"
    # the per-step cap: a second mini-batch of the same step only gets what is left
    pl2 = StapoPolicyLossConfig(loss_mode="stapo", entropy_quantile=0.25, dump_tokens=True, dump_dir=str(tmp_path),
                                dump_max_rows_per_step=8)
    state.STEP.minibatch = 2
    assert dump_minibatch_tokens(td, pl2, stats, (keep, lp, ent, adv, valid), tokenizer=tok, dp_rank=2) == 2
    assert dump_minibatch_tokens(td, pl2, stats, (keep, lp, ent, adv, valid), tokenizer=tok, dp_rank=2) == 0
    state.STEP.rows_dumped = 0


def test_global_step_from_the_batch():
    td = TensorDict({"global_steps": torch.tensor([4, 4, 4])}, batch_size=[3])
    assert _global_step(td, 99) == 4
    assert _global_step(TensorDict({}, batch_size=[3]), 99) == 99


def test_nonfinite_metric_is_replaced_by_the_exact_global_total():
    from verl.utils import tensordict_utils as tu

    # what TrainingWorker.train_batch returns on DP = 2 after allgather: one Metric (2 micro-batches) per rank
    key = "actor/stapo/nonfinite_tokens"
    per_rank = [Metric(AggregationType.MEAN), Metric(AggregationType.MEAN)]
    per_rank[0].extend([1.0, 2.0])
    per_rank[1].extend([0.0, 1.0])
    metrics = {key: per_rank}
    out = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})
    _fix_nonfinite_metric(out, 7.0)
    assert Metric.aggregate_dp(tu.get(out, "metrics")[key]) == 7.0
