"""verl 0.9.1's real ``MegatronEngineWithLMHead`` with the token mask on the CPU over gloo, fp32, at TP=2 / PP=2 / DP=2
against TP=1 PP=1 and against an unsharded HF-transformers reference.

Each layout is one gloo job (``megatron_engine_job.py``, N processes, ``VERL_PLATFORM=cpu`` so the plugin's entry
point installs the CPU platform and the :mod:`stapo_verl.cpu.megatron_shims` shims): ``initialize`` (mbridge loads the
HF weights, scattered over TP/PP), ``infer_batch`` (old log-probs + entropy), then two ``train_batch`` calls through
the plugin's ``TrainingWorker.train_batch`` wrapper on an 8-sequence mini-batch in 2-sequence micro-batches:
``loss_mode=stapo`` (vanilla + S2T), then ``loss_mode=gspo`` with ``token_mask=s2t``. Grads (before the optimizer
step) and weights are exported to HF names through the bridge, so layouts compare element-wise.

``stats_source=current_minibatch`` runs separately at TP=2 (PP=1; PP>1 is rejected by design): the FSDP test's job
(``current_minibatch_job.py --engine megatron``, verl's real ``TrainingWorker`` over 4 mini-batches) with the FSDP
test's assertions.
"""

import json
import time
from pathlib import Path

import pytest
import torch
from support.megatron_launch import hf_model as _hf_model
from support.megatron_launch import make_model_dir, run_job
from support.megatron_launch import reference as _reference
from support.current_minibatch_checks import check_current_route, check_exact_renormalisation

LAYOUTS = {"tp1": (1, 1, 1), "tp2": (2, 1, 2), "pp2": (1, 2, 2), "dp2": (1, 1, 2)}  # name: (tp, pp, world)
PARALLEL = ("tp2", "pp2", "dp2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    out = {"model_dir": make_model_dir(root / "model"), "wall_s": {}}
    for name, (tp, pp, world) in LAYOUTS.items():
        t0 = time.perf_counter()
        run_job(root / f"{name}.pt", out["model_dir"], tp, pp, world)
        out["wall_s"][name] = round(time.perf_counter() - t0, 1)
        out[name] = torch.load(root / f"{name}.pt", weights_only=False)
    print("megatron engine job wall s per layout (2 shared cores):", out["wall_s"])
    return out


def _micro_batches(step):
    return [mb for rank_seen in step["seen"] for mb in rank_seen]


def _assert_tensors_close(a, b, atol, rtol=1e-5):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=lambda m, k=k: f"{k}: {m}")


def test_engine_runs_on_cpu_with_the_plugin(runs):
    for name in LAYOUTS:
        r = runs[name]
        assert r["device"] == "cpu" and r["engine"] == "MegatronEngineWithLMHead" and r["wrapped"], name
        assert r["dp_size"] == (2 if name == "dp2" else 1)
        for route in ("old_policy", "gspo"):
            assert r[route]["n_micro_batches"] == 4 // r["dp_size"]  # several micro-batches per rank


@pytest.mark.parametrize("layout", ["tp1", "tp2", "pp2"])
def test_infer_batch_log_probs_and_entropy_match_unsharded_reference(runs, layout):
    r = runs[layout]
    torch.testing.assert_close(r["infer_log_probs"], runs["tp1"]["infer_log_probs"], atol=2e-6, rtol=0)
    torch.testing.assert_close(r["infer_entropy"], runs["tp1"]["infer_entropy"], atol=2e-6, rtol=0)
    model = _hf_model(runs["model_dir"], r["old_policy"]["before"])  # the initial weights, exported by the bridge
    for j, (prompt, response) in enumerate(r["rows"]):
        ent, lp = _reference(model, prompt, response, 1.0)
        torch.testing.assert_close(r["infer_log_probs"][j, : len(response)].double(), lp, atol=5e-6, rtol=0)
        torch.testing.assert_close(r["infer_entropy"][j, : len(response)].double(), ent, atol=5e-6, rtol=0)


def _mask_metric(step, key):
    values = {float(v) for m in step["metrics"] for v in (m[key] if isinstance(m[key], list) else [m[key]])}
    assert len(values) == 1, (key, values)  # one global statistic per mini-batch, on every DP rank
    return values.pop()


@pytest.mark.parametrize("layout", PARALLEL)
def test_stapo_train_batch_matches_tp1(runs, layout):
    """loss_mode=stapo (S2T mask from the old-policy pass): counts, PG denominator, loss, grad norm, grads and
    updated weights vs TP=1 PP=1, and the PG loss in closed form."""
    ref, r = runs["tp1"]["old_policy"], runs[layout]["old_policy"]
    n_valid = runs[layout]["n_valid"]
    n_masked = _mask_metric(r, "actor/stapo/num_masked")
    assert n_masked == _mask_metric(ref, "actor/stapo/num_masked")
    assert _mask_metric(r, "actor/stapo/tau_h") == pytest.approx(_mask_metric(ref, "actor/stapo/tau_h"), rel=1e-6)
    assert 0 < n_masked < _mask_metric(r, "actor/stapo/num_candidates") <= n_valid
    # Σ K over the mini-batch (all DP ranks) = N_valid − N_masked, the same tokens as on TP=1, and it is the PG
    # denominator of every micro-batch
    keep = torch.cat([mb["keep"][mb["response_mask"].bool()] for mb in _micro_batches(r)])
    assert int(keep.sum()) == n_valid - n_masked
    assert torch.equal(keep, torch.cat([mb["keep"][mb["response_mask"].bool()] for mb in _micro_batches(ref)]))
    assert {mb["pg_batch_num_tokens"] for mb in _micro_batches(r)} == {n_valid - n_masked}
    # the engine counted every valid token (loss_mask intact for verl's KL/entropy terms) ...
    assert r["batch_num_tokens"] == ref["batch_num_tokens"] == n_valid
    # ... and the PG term is normalised by N_valid − N_masked: at π_θ = π_old every kept token's loss is −Â, so
    # the micro-batch losses (all ranks) sum to −Σ_K Â / (N_valid − N_masked). verl multiplies each rank's loss by
    # dp_size (Megatron's DDP averages the gradients over DP), hence the division.
    adv_tok = torch.cat([mb["advantages"][mb["response_mask"].bool()] for mb in _micro_batches(r)])
    expected = -float((adv_tok * keep).sum()) / (n_valid - n_masked)
    pg = sum(sum(m["actor/pg_loss"]) for m in r["metrics"]) / runs[layout]["dp_size"]
    assert pg == pytest.approx(expected, abs=1e-6)
    assert pg == pytest.approx(sum(sum(m["actor/pg_loss"]) for m in ref["metrics"]), abs=1e-6)
    assert r["metrics"][0]["grad_norm"] == pytest.approx(ref["metrics"][0]["grad_norm"], rel=1e-6)
    _assert_tensors_close(r["grads"], ref["grads"], atol=1e-6)
    _assert_tensors_close(r["after"], ref["after"], atol=1e-6)
    changed = [k for k in r["after"] if not torch.equal(r["after"][k], r["before"][k])]
    assert changed == list(r["after"])  # the optimizer step moved every weight


@pytest.mark.parametrize("layout", PARALLEL)
def test_s2t_in_front_of_gspo_matches_tp1(runs, layout):
    """loss_mode=gspo with token_mask=s2t on the updated weights: silenced tokens > 0, PG denominator Σ K, and the
    same grads on every layout."""
    ref, r = runs["tp1"]["gspo"], runs[layout]["gspo"]
    n_valid = runs[layout]["n_valid"]
    n_masked = _mask_metric(r, "actor/stapo/num_masked")
    assert n_masked > 0 and n_masked == _mask_metric(ref, "actor/stapo/num_masked")
    assert {mb["pg_batch_num_tokens"] for mb in _micro_batches(r)} == {n_valid - n_masked}
    assert r["batch_num_tokens"] == n_valid
    assert r["metrics"][0]["grad_norm"] == pytest.approx(ref["metrics"][0]["grad_norm"], rel=1e-6)
    _assert_tensors_close(r["grads"], ref["grads"], atol=1e-6)


def test_current_minibatch_route_on_megatron_tp2(tmp_path):
    """``stats_source=current_minibatch`` on verl's ``TrainingWorker`` + Megatron engine at TP=2 (2 gloo ranks):
    mini-batch 0 (no optimizer step yet) gives π_old's mask exactly; after each optimizer step (lr 3e-2) the mask uses the current policy's
    log-probs (both TP ranks agree), which the training forward reproduces; PG denominator N_valid − N_masked; the
    reported mask disagreement counts the decisions that differ from the old_policy mask. The job's inference
    micro-batch (4 rows) does not divide the 2-row mini-batch, as a tuned ``log_prob_micro_batch_size_per_gpu``
    may not."""
    out = tmp_path / "report.json"
    t0 = time.perf_counter()
    run_job(out, make_model_dir(tmp_path / "model"), 2, 1, 2, job=Path(__file__).with_name("current_minibatch_job.py"),
            argv=[out, "--engine", "megatron", "--tp", "2", "--model-dir", tmp_path / "model"])
    print(f"current_minibatch megatron tp2 job wall s (2 shared cores): {time.perf_counter() - t0:.1f}")
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and r["micro_batches_per_minibatch"] == 1
    check_current_route(r)
    check_exact_renormalisation(r)
