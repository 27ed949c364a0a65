"""The planted-token warm start (``benchmarks/planted_token.py``), built for real once into its cache directory (about
4 minutes on an idle core, like the tiny assets on first use): J is rare, it sits at confident slots (their entropy
below the 0.75 quantile of the response positions'), a J makes later J's more likely, the policy's own samples hold
few J's, and the responses with two or more J's are wrong."""

import pytest
from support.bench_modules import benchmark_module


@pytest.fixture(scope="module")
def planted():
    import torch

    torch.set_num_threads(1)
    with benchmark_module("tiny_policy") as tp, benchmark_module("planted_token") as pt:
        manifest = pt.build(pt.default_dir())
        policy = tp.load_policy(pt.default_dir())
        rows = tp.read_rows(manifest["val_file"])
        problems = [{"question": r["prompt"][0]["content"], "solution": r["extra_info"]["solution"],
                     "answer": r["reward_model"]["ground_truth"]} for r in rows[:128]]
        yield pt, policy, rows, problems


def test_j_is_rare_and_planted_at_confident_slots(planted):
    pt, policy, _, problems = planted
    m = pt.j_probability(policy.model, policy.tokenizer, problems)
    assert m["p_j_clean"] < 0.02 and m["p_j_clean_max"] < 0.1  # rare: below the testbed's τ_p everywhere
    assert m["p_j_clean"] > 10 * m["p_j_other"]  # at the slots, not everywhere
    assert m["entropy_slots"] < m["entropy_q75"] and m["share_slots_below_q75"] >= 0.9  # confident contexts
    assert m["p_j_after_j"] > 1.5 * m["p_j_clean"]  # one J makes the next more likely


def test_the_policy_samples_few_js_and_several_break_the_answer(planted):
    pt, policy, rows, _ = planted
    s = pt.sampled_j(policy, rows[:128], n=4, seed=1)
    assert 0 < s["j_rate"] < 0.01  # rare
    # but far above a stray token's rate (0.01 of the mass over ~370 tokens, ~20 positions: ~0.3 of 512 responses)
    assert s["responses_with_j"] >= 15
    assert s["acc_no_j"] > 0.5
    assert s["acc_two_or_more_j"] is not None and s["acc_two_or_more_j"] < s["acc_no_j"] - 0.3
