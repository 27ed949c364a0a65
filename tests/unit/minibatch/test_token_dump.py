"""The silenced-token dump (``stapo_verl.minibatch.token_dump``), in-process.

End-to-end rows through verl's real TrainingWorker are checked in ``tests/integration/core/test_current_minibatch.py``.
"""

import json

import pytest
import torch
from support.tokenizers import CountingTokenizer
from support.verl_batches import actor_config
from tensordict import TensorDict

from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask
from stapo_verl.core.lab_masks import global_step_of
from stapo_verl.core.masks import S2T_FIELDS
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError
from stapo_verl.minibatch import token_dump
from stapo_verl.minibatch.dump_schema import ROW_TYPES, SCHEMA


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


def _dump(td, cfg, metrics, budget, tok, minibatch=1):
    batch = {k: td[k] for k in S2T_FIELDS}
    return token_dump.dump_minibatch_tokens(td, batch, td[POLICY_LOSS_MASK_KEY].bool(), config=cfg, step=5,
                                            minibatch=minibatch, dp_rank=2, tokenizer=tok, budget=budget,
                                            tau_h=metrics.get("actor/stapo/tau_h"))


def test_dump_rows_are_exact_and_decoding_is_proportional_to_dumped_rows(tmp_path):
    cfg = actor_config("stapo", s2t_entropy_quantile=0.25, dump_tokens=True, dump_dir=str(tmp_path))
    td = _minibatch()
    metrics = apply_policy_token_mask(cfg, td)
    assert metrics["actor/stapo/num_masked"] == 3 and metrics["actor/stapo/num_candidates"] == 12
    keep, ent = td[POLICY_LOSS_MASK_KEY].bool(), td["entropy"]
    tok = CountingTokenizer()
    n = _dump(td, cfg, metrics, 256, tok)
    assert n == 6
    # 3 decodes per row (token, left, right), each ≤ 8 ids + 1: O(rows), independent of the 300 tokens
    assert tok.decoded <= 6 * 17
    rows = [json.loads(x) for x in (tmp_path / "stapo_tokens.dp2.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["silenced"] * 3 + ["kept"] * 3
    for r in rows:
        assert tuple(r) == SCHEMA
        # what the writer writes is what the readers (plots, tables) accept: ROW_TYPES, bool never a number
        assert all(isinstance(r[k], t) and not isinstance(r[k], bool) for k, t in ROW_TYPES.items()), r
        i, t = r["sample_index"], r["position"]
        assert r["token_id"] == int(td["responses"][i, t]) and r["token"] == f"t{r['token_id']}"
        assert r["p"] == pytest.approx(float(torch.tensor(-9.0).double().exp()))
        assert r["entropy"] == pytest.approx(float(ent[i, t])) and r["advantage"] == 1.0
        assert bool(keep[i, t]) == (r["kind"] == "kept")
        assert (r["step"], r["minibatch"], r["dp_rank"], r["tau_p"]) == (5, 1, 2, 0.002)
        assert r["tau_h"] == pytest.approx(metrics["actor/stapo/tau_h"]) and r["stats_source"] == "old_policy"
    # the budget: a second mini-batch of the same step only gets what is left of the per-step cap
    assert _dump(td, cfg, metrics, 2, tok, minibatch=2) == 2
    assert _dump(td, cfg, metrics, 0, tok, minibatch=3) == 0


def test_global_step_from_the_batch():
    assert global_step_of(torch.tensor([4, 4, 3])) == 4
    assert global_step_of([None, 2, 5]) == 5 and global_step_of(7) == 7
    for bad in (torch.tensor([]), [None], None):
        with pytest.raises(ValueError, match="global_steps"):
            global_step_of(bad)


def test_rows_of_an_interrupted_attempt_are_replaced(tmp_path):
    """drop_rows_from removes the rows at or after (step, minibatch), keeps the earlier ones byte for byte, drops a
    torn last line, and leaves the file alone when it ends earlier."""
    path = str(tmp_path / "stapo_tokens.dp0.jsonl")
    assert token_dump.drop_rows_from(path, 1, 0) == 0  # no file yet
    rows = [{"step": s, "minibatch": m, "token": f"t{s}{m}"} for s in (1, 2, 3) for m in (0, 1)]
    token_dump.append_jsonl(path, rows)
    before = open(path, encoding="utf-8").read()
    assert token_dump.drop_rows_from(path, 4, 0) == 0 and open(path, encoding="utf-8").read() == before
    assert token_dump.drop_rows_from(path, 2, 1) == 3
    kept = [json.loads(x) for x in open(path, encoding="utf-8")]
    assert [(r["step"], r["minibatch"]) for r in kept] == [(1, 0), (1, 1), (2, 0)]
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 2, "minib')  # a writer killed mid-line
    assert token_dump.drop_rows_from(path, 2, 1) == 1
    assert [json.loads(x)["step"] for x in open(path, encoding="utf-8")] == [1, 1, 2]
