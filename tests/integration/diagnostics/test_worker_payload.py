"""The diagnostics on verl's real ``TrainingWorker``: FSDP2 at DP=2 with a clipping optimizer, and Megatron at TP=2
(DP=1, no clipping), same model, same 8-row batch, same 2 optimizer mini-batches (``worker_job.py``).

What must agree between the two: every mask statistic of both mini-batches (the DP=2 run gathers the candidates of
both ranks), the update's histograms, and the first mini-batch's LM-head gradient norm (FSDP2: read after a step
clipped at 1e-4 from a sharded DTensor and un-clipped; Megatron: read from the vocab-parallel ``main_grad`` before the
step, summed over TP). The DP=2 payload carries rows from both ranks, the Megatron one from its one DP rank.
"""

import json

import pytest
from support.megatron_launch import make_model_dir, run_job
from support.procs import TESTS

from stapo_verl.diagnostics.stats import HISTOGRAMS
from stapo_verl.minibatch.dump_schema import SCHEMA

JOB = TESTS / "integration" / "diagnostics" / "worker_job.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diag")
    model = make_model_dir(root / "model")
    out = {}
    for name, world, argv in (("fsdp_dp2", 2, ["--engine", "fsdp", "--clip", "1e-4"]),
                              ("megatron_tp2", 2, ["--engine", "megatron", "--tp", "2"])):
        path = root / f"{name}.json"
        run_job(path, model, 1, 1, world, job=JOB, argv=[path, model, *argv, "--dump-dir", root / name])
        out[name] = json.loads(path.read_text())
    return out


def test_mask_statistics_agree_across_engines_and_dp(runs):
    f, m = runs["fsdp_dp2"], runs["megatron_tp2"]
    assert f["dp"] == 2 and m["dp"] == 1
    keys = ("candidate_entropy_p50", "candidate_entropy_p75", "candidate_entropy_p95", "pos_adv_below_tau_p_frac",
            "silenced_share_begin", "silenced_share_middle", "silenced_share_end", "tau_h", "num_candidates",
            "silenced_grad_share", "silenced_grad_share_upper")
    for k in keys:
        assert f["metrics"][f"actor/stapo/{k}"] == pytest.approx(m["metrics"][f"actor/stapo/{k}"], rel=1e-6), k
    # with entropy_quantile=0.75 the candidates' p75 is τ_h itself (same quantile of the same population)
    assert f["metrics"]["actor/stapo/candidate_entropy_p75"] == pytest.approx(f["metrics"]["actor/stapo/tau_h"])
    # the population really splits: some positive-advantage tokens are above τ_p, some below
    assert all(0 < x < 1 for x in f["metrics"]["actor/stapo/pos_adv_below_tau_p_frac"])
    for mb in range(2):
        shares = [f["metrics"][f"actor/stapo/silenced_share_{b}"][mb] for b in ("begin", "middle", "end")]
        assert sum(shares) == pytest.approx(1.0)
        # the silenced tokens carry part, not all, of the PG logit-gradient norm² (|V| from the model config)
        assert 0 < f["metrics"]["actor/stapo/silenced_grad_share"][mb] < 1
        assert 0 < f["metrics"]["actor/stapo/silenced_grad_share_upper"][mb] < 1


def test_histograms_of_the_update_agree_and_count_the_candidates(runs):
    f, m = runs["fsdp_dp2"], runs["megatron_tp2"]
    assert sorted(f["histograms"]) == sorted(HISTOGRAMS)
    for name in HISTOGRAMS:
        assert f["histograms"][name]["counts"] == m["histograms"][name]["counts"], name
    n_cand = sum(f["metrics"]["actor/stapo/num_candidates"])  # summed over the update's 2 mini-batches
    assert sum(f["histograms"]["entropy_adv_pos"]["counts"]) == n_cand
    assert sum(f["histograms"]["log10_p_adv_pos"]["counts"]) == n_cand
    assert sum(f["histograms"]["entropy_adv_neg"]["counts"]) > 0  # the batch has negative advantages too
    assert f["histograms"]["log10_p_adv_pos"]["high"] < f["histograms"]["log10_p_adv_pos"]["edges"][-1]  # p < τ_p


def test_lm_head_grad_norm_is_the_same_pre_clip_value_on_both_engines(runs):
    f, m = runs["fsdp_dp2"], runs["megatron_tp2"]
    lf, lm = f["metrics"]["actor/stapo/lm_head_grad_norm"], m["metrics"]["actor/stapo/lm_head_grad_norm"]
    # mini-batch 0: same weights, same data; FSDP clipped its step at 1e-4 (coefficient ~3e-5), Megatron did not
    assert lf[0] == pytest.approx(lm[0], rel=1e-5)
    assert f["grad_norm"][0] == pytest.approx(m["grad_norm"][0], rel=1e-5)
    assert 0 < lm[0] < m["grad_norm"][0]  # one weight's part of the total norm
    # mini-batch 1 comes after a clipped vs an unclipped step: different weights, different gradients
    assert lf[1] != pytest.approx(lm[1], rel=1e-3)


def test_payload_carries_every_dp_ranks_rows_once_per_update(runs):
    for name, ranks in (("fsdp_dp2", {0, 1}), ("megatron_tp2", {0})):
        r = runs[name]
        assert r["n_payloads"] == 1 and r["payload_step"] == 4  # attached to the update's last mini-batch only
        assert r["rows"] and all(tuple(row) == SCHEMA for row in r["rows"])
        assert {row["dp_rank"] for row in r["rows"]} == ranks
        assert {row["minibatch"] for row in r["rows"]} == {0, 1}
        sil = sum(row["kind"] == "silenced" for row in r["rows"])
        assert sil == sum(r["metrics"]["actor/stapo/num_masked"])  # under the caps, every silenced token is there
        assert 0 < len(r["rows"]) - sil <= sil
        assert r["rows_selected"] == len(r["rows"])
        # the dump the driver writes: every DP rank's rows by rank, the table's rows in rank order (no cap reached)
        assert set(r["dump"]) == {str(rank) for rank in ranks}
        assert [row for rank in sorted(ranks) for row in r["dump"][str(rank)]] == r["rows"]
