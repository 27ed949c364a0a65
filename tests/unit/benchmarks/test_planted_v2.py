"""planted_v2 (``benchmarks/planted_v2.py``): the design's draws and masked labels on the data, and its four
admission tests on the built assets (built once and cached in ``planted_v2.default_dir()``; minutes on 2 cores the
first time): one J leaves the answer correct, J breeds, J is rare, chains of J break the answer and J's are not
sampled in responses already garbled."""

import random

import pytest
from support.bench_modules import benchmark_module

from stapo_verl.cpu import make_assets as M
from stapo_verl.rewards import compute_score


@pytest.fixture(scope="module")
def pv():
    with benchmark_module("tiny_policy"), benchmark_module("planted_token"), \
            benchmark_module("planted_v2") as module:
        yield module


@pytest.fixture(scope="module")
def admission(pv):
    """The admission measurements of the built assets, measured again here from the saved model."""
    import torch

    torch.set_num_threads(1)
    manifest = pv.build(log=lambda s: None)
    tp = __import__("tiny_policy")
    from pathlib import Path

    policy = tp.load_policy(Path(manifest["model_dir"]).parent)
    return pv.admission(policy.model, policy.tokenizer, pv.val_problems(manifest))


def _problems(n, seed=0):
    rng = random.Random(seed)
    return [M.make_problem(rng) for _ in range(n)]


def test_one_and_two_js_keep_the_reward_and_a_chain_breaks_it(pv):
    for p in _problems(50, seed=2):
        def score(slots):
            return compute_score("math_dapo", pv.solution(p, slots), p["answer"], timeout_s=0)["score"]

        assert score(()) == score((1,)) == score((0, 3)) == 1.0
        assert score((0, 1, 2)) == score((1, 2, 3)) == -1.0
        assert pv.solution(p, ()) == p["solution"]


def test_the_draws_match_their_rates(pv):
    rng = random.Random(0)
    p = _problems(1)[0]
    n = 100_000
    draws = [pv.draw_example(p, rng) for _ in range(n)]
    plain = [s for s, f in draws if not f]
    forced_one = [(s, f) for s, f in draws if len(f) == 1]
    breaks = [(s, f) for s, f in draws if len(f) == pv.BREAK_AT]
    assert len(breaks) / n == pytest.approx(pv.BREAK_SHARE, abs=0.004)
    assert len(forced_one) / n == pytest.approx(pv.CHAIN_SHARE, abs=0.005)
    # plain examples: P(at least one J) = 1 - (1 - p_first)^4
    assert sum(bool(s) for s in plain) / len(plain) == pytest.approx(1 - (1 - pv.P_FIRST) ** 4, abs=0.0012)
    # after a forced J at slot 0: each later slot holds a J with p_next
    after = [k in s for s, f in forced_one if f == [0] for k in (1, 2, 3)]
    assert sum(after) / len(after) == pytest.approx(pv.P_NEXT, abs=0.01)


def test_only_forced_js_lose_their_label(pv, tmp_path):
    probs = _problems(300, seed=3)
    tok = M.build_tokenizer([p["question"] + "\n" + p["solution"] for p in probs] + ["user\nassistant\n"] * 5,
                            tmp_path)
    j = tok.encode(pv.J_TEXT, add_special_tokens=False)[0]
    p = probs[0]
    _, ids, labels = pv.encode_example(tok, p, [1, 2, 3], [1, 2, 3])
    assert ids.count(j) == 4  # three in the working, one in the box
    assert [i for i, (t, lab) in enumerate(zip(ids, labels)) if lab == -100] == \
        [i for i, t in enumerate(ids) if t == j][:3]
    _, ids, labels = pv.encode_example(tok, p, [1, 3], [1])
    assert [t for t, lab in zip(ids, labels) if lab == -100] == [j] and ids.count(j) == 2
    _, ids, labels = pv.encode_example(tok, p, [2], [])
    assert -100 not in labels and ids.count(j) == 1


def test_admission_one_j_leaves_the_answer_correct(pv, admission):
    assert admission["acc_one_j"] >= admission["acc_clean"] - pv.MAX_ONE_J_ACC_LOSS


def test_admission_j_breeds(pv, admission):
    assert admission["breeding"] >= pv.MIN_BREEDING


def test_admission_j_is_rare(pv, admission):
    assert admission["p_j_clean"] < pv.MAX_P_CLEAN


def test_admission_chains_break_the_answer_later(pv, admission):
    assert admission["acc_broken"] < pv.MAX_BROKEN_ACC
    assert admission["j_responses"] >= 10  # enough sampled J's to judge where they come
    assert admission["garbled_share"] < pv.MAX_GARBLED
