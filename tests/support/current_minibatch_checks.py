"""Assertions on the report of ``tests/integration/core/current_minibatch_job.py``, shared by the FSDP and the
Megatron runs of that job."""

from __future__ import annotations

import pytest


def check_current_route(r):
    """Every mini-batch's mask comes from the current policy, which the training forward sees too; the first one
    (no optimizer step yet) equals the old-policy mask; the reported disagreement counts the differing decisions."""
    assert r["n_minibatches"] == 4 and r["ranks_agree"]
    # mini-batch 0: no optimizer step since the old-log-prob pass → the current forward reproduces π_old
    assert r["lp_shift"][0] < 1e-5 and r["equals_old_policy_mask"][0]
    # later mini-batches: p comes from the current weights (moved by the earlier optimizer steps) and is what the
    # training forward of that mini-batch sees (kept tokens; one micro-batch per mini-batch)
    assert min(r["lp_shift"][1:]) > 1e-3
    assert max(r["mask_lp_vs_training_lp_maxdiff"]) < 1e-5
    assert not all(r["equals_old_policy_mask"][1:])  # the two sources disagree somewhere (constructed: lr 3e-2)
    m = r["metrics"]
    assert m["actor/stapo/mask_disagreement"][0] == 0.0 and sum(m["actor/stapo/mask_disagreement"][1:]) > 0
    assert [d > 0 for d in m["actor/stapo/mask_disagreement"]] == [not e for e in r["equals_old_policy_mask"]]
    # the reported disagreement counts exactly the valid tokens whose keep decision differs from the old_policy mask
    assert m["actor/stapo/mask_disagreement"] == [float(d) for d in r["disagreement_expected"]]
    assert m["actor/stapo/mask_disagreement_frac"] == pytest.approx(
        [d / v for d, v in zip(r["disagreement_expected"], r["n_valid"], strict=True)], rel=1e-12)
    assert all(s > 0 for s in m["actor/stapo/current_forward_s"])


def check_exact_renormalisation(r):
    """PG denominator N_valid − N_masked per mini-batch; the engine's count stays N_valid."""
    assert r["n_valid"] == r["n_valid_expected"]
    assert r["n_keep"] == [v - k for v, k in zip(r["n_valid"], r["n_masked"], strict=True)]
    assert r["pg_batch_num_tokens"] == [float(k) for k in r["n_keep"]]
    assert r["engine_batch_num_tokens"] == [float(v) for v in r["n_valid"]]  # KL/entropy: all valid tokens
    # the policy-gradient call sees ΣK, then ppo_loss sets the engine's count back for the KL and entropy terms
    assert r["batch_num_tokens_writes"] == [[float(v), float(k), float(v)]
                                            for v, k in zip(r["n_valid"], r["n_keep"], strict=True)]
    assert r["metrics"]["actor/stapo/num_masked"] == [float(k) for k in r["n_masked"]]
