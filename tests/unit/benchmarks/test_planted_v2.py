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
def measured(pv):
    """The admission measurements of the built assets, measured again here from the saved model on the first
    ``TEST_PROBLEMS`` validation problems (all 640, as the build measures them), and the build's own record."""
    import torch

    torch.set_num_threads(1)
    manifest = pv.build(log=lambda s: None)
    tp = __import__("tiny_policy")
    from pathlib import Path

    policy = tp.load_policy(Path(manifest["model_dir"]).parent)
    return pv.admission(policy.model, policy.tokenizer, pv.val_problems(manifest)[:pv.TEST_PROBLEMS]), manifest


@pytest.fixture(scope="module")
def admission(measured):
    return measured[0]


def test_the_saved_model_gives_the_builds_admission_numbers(measured):
    again, manifest = measured
    assert again == manifest["planted"]["admission"]  # built and measured on this machine: every value equal


def _problems(n, seed=0):
    rng = random.Random(seed)
    return [M.make_problem(rng) for _ in range(n)]


def test_one_and_two_js_keep_the_reward_and_a_run_of_three_breaks_it(pv):
    for p in _problems(50, seed=2):
        def score(run):
            return compute_score("math_dapo", pv.solution(p, run), p["answer"], timeout_s=0)["score"]

        assert score(0) == score(1) == score(2) == 1.0
        assert score(3) == score(4) == -1.0
        assert pv.solution(p, 0) == p["solution"]
        assert pv.solution(p, 2).replace(pv.J_TEXT, "") == p["solution"]
        assert pv.solution(p, 2).startswith(pv.prefix(p) + 2 * pv.J_TEXT + "=")


def test_the_draws_match_their_rates(pv):
    rng = random.Random(0)
    n = 200_000
    draws = [pv.draw_example(rng) for _ in range(n)]
    plain = [r for r, f in draws if not f]
    forced_one = [r for r, f in draws if f == 1]
    breaks = [r for r, f in draws if f == pv.BREAK_AT]
    assert len(breaks) / n == pytest.approx(pv.BREAK_SHARE, abs=0.002)
    assert len(forced_one) / n == pytest.approx(pv.CHAIN_SHARE, abs=0.003)
    assert sum(r > 0 for r in plain) / len(plain) == pytest.approx(pv.P_FIRST, abs=0.0002)
    assert min(breaks) == pv.BREAK_AT and min(forced_one) == 1
    # after a forced J, one more J with p_next
    assert sum(r >= 2 for r in forced_one) / len(forced_one) == pytest.approx(pv.P_NEXT, abs=0.006)
    assert max(r for r, _ in draws) <= pv.RUN_CAP


def test_only_forced_js_lose_their_label(pv, tmp_path):
    probs = _problems(300, seed=3)
    tok = M.build_tokenizer([p["question"] + "\n" + p["solution"] for p in probs] + ["user\nassistant\n"] * 5,
                            tmp_path)
    j = tok.encode(pv.J_TEXT, add_special_tokens=False)[0]
    p = probs[0]
    _, ids, labels = pv.encode_example(tok, p, 4, 3)
    assert ids.count(j) == 5  # a run of four, one in the box
    where = [i for i, t in enumerate(ids) if t == j]
    assert [i for i, lab in enumerate(labels) if lab == -100] == where[:3]
    _, ids, labels = pv.encode_example(tok, p, 2, 1)
    assert [t for t, lab in zip(ids, labels) if lab == -100] == [j] and ids.count(j) == 2
    _, ids, labels = pv.encode_example(tok, p, 1, 0)
    assert -100 not in labels and ids.count(j) == 1


def test_admission_one_j_costs_accuracy_on_the_registered_build(pv, admission):
    """The registered build fails this admission check, as docs/results.md records in the amendment (all 640
    problems: 0.795 after one J against 0.834 without): one J costs more than the allowed 0.02."""
    assert admission["acc_one_j"] < admission["acc_clean"] - pv.MAX_ONE_J_ACC_LOSS


def test_admission_j_breeds(pv, admission):
    assert admission["breeding"] >= pv.MIN_BREEDING


def test_admission_j_is_rare(pv, admission):
    assert admission["p_j_clean"] < pv.MAX_P_CLEAN


def test_admission_a_run_of_js_breaks_the_answer(pv, admission):
    assert admission["acc_broken"] < pv.MAX_BROKEN_ACC


def test_admission_js_come_after_garbled_prefixes_on_the_registered_build(pv, admission):
    """The registered build fails this admission check, as docs/results.md records in the amendment (all 640
    problems: 0.69 of the first-J mass at garbled prefixes, against the allowed 0.10)."""
    assert admission["mass_clean"] > 0 and admission["responses"] >= 1000
    assert admission["garbled_share"] >= pv.MAX_GARBLED
