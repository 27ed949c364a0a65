"""The planted spurious token's design (``benchmarks/planted_token.py``), on the data: J is one token that the
synthetic data never holds; it is drawn rarely at the slots, and after one J more J's follow (the draw rates against
their closed forms); one J leaves the boxed answer and the project's reward unchanged, two break it; the slots sit
before punctuation; the mask-against-J counts from the two dumps."""

import json
import random

import pytest
from support.bench_modules import benchmark_module

from stapo_verl.cpu import make_assets as M
from stapo_verl.rewards import compute_score


@pytest.fixture(scope="module")
def pt():
    with benchmark_module("tiny_policy"), benchmark_module("planted_token") as module:
        yield module


def _problems(n, seed=0):
    rng = random.Random(seed)
    return [M.make_problem(rng) for _ in range(n)]


def test_the_clean_solution_is_the_original_and_slots_precede_punctuation(pt):
    for p in _problems(200):
        assert pt.with_j(p, ()) == p["solution"]
        assert pt.J_TEXT not in p["question"] + p["solution"]
        sol = p["solution"]
        assert [sol[c] for c in pt._slot_chars(p, ())] == ["=", ".", "=", "."]
        one = pt.with_j(p, (2,))
        assert one.count(pt.J_TEXT) == 1 and one.replace(pt.J_TEXT, "") == sol


def test_one_j_keeps_the_reward_and_two_break_the_answer(pt):
    for p in _problems(50, seed=1):
        def score(text):
            return compute_score("math_dapo", text, p["answer"], timeout_s=0)["score"]

        assert score(p["solution"]) == 1.0
        assert all(score(pt.with_j(p, (k,))) == 1.0 for k in range(pt.SLOTS))
        assert score(pt.with_j(p, (0, 3))) == -1.0  # the box holds J + answer
        assert score(pt.with_j(p, (0, 1, 2))) == -1.0


def test_j_is_rare_first_and_breeds_after(pt):
    rng = random.Random(7)
    first_slot0 = after = after_n = 0
    trials = 40000
    problems = _problems(100, seed=2)
    for i in range(trials):
        sol, count = pt.plant(problems[i % 100], rng)
        assert sol.count(pt.J_TEXT) == count + (count >= pt.BREAK_AT)  # the box's J when broken
        js = [c for c in pt._slot_chars(problems[i % 100], ()) if True]
        first_slot0 += sol.startswith(problems[i % 100]["solution"][:js[0]] + pt.J_TEXT)
        if count:
            after_n += 1
            after += count - 1
    # slot 0's J rate is P_FIRST (binomial sd ~ 0.0004 at 40000 draws)
    assert first_slot0 / trials == pytest.approx(pt.P_FIRST, abs=0.0015)
    # every solution with a J has on average P_NEXT x (slots after the first J) more: far above P_FIRST
    assert after / after_n > 10 * pt.P_FIRST * (pt.SLOTS - 1)


def test_j_is_one_token_of_the_tiny_tokenizer(pt, tmp_path):
    probs = _problems(300, seed=3)
    tok = M.build_tokenizer([p["question"] + "\n" + p["solution"] for p in probs] + ["user\nassistant\n"] * 5,
                            tmp_path)
    ids = tok.encode(pt.J_TEXT, add_special_tokens=False)
    assert len(ids) == 1
    for p in probs[:20]:
        clean = tok.encode(p["solution"], add_special_tokens=False)
        planted = tok.encode(pt.with_j(p, (1,)), add_special_tokens=False)
        assert planted.count(ids[0]) == 1 and [t for t in planted if t != ids[0]] == clean


def test_mask_vs_j_counts_from_the_dumps(pt, tmp_path):
    run = tmp_path / "run"
    (run / "rollout").mkdir(parents=True)
    dump = run / "tokens" / "stapo_tokens.dp0.jsonl"
    dump.parent.mkdir()
    rows = [{"step": 1, "kind": "silenced", "token_id": 96}, {"step": 1, "kind": "silenced", "token_id": 5},
            {"step": 1, "kind": "kept", "token_id": 96}, {"step": 2, "kind": "silenced", "token_id": 96}]
    dump.write_text("\n".join(json.dumps(r) for r in rows))
    # step 1: group a mixed (its correct response holds 2 J's), group b all correct (no positive advantage)
    gen = [{"input": "a", "output": "1~=2~.", "score": 1.0}, {"input": "a", "output": "x", "score": -1.0},
           {"input": "b", "output": "~", "score": 1.0}, {"input": "b", "output": "~", "score": 1.0}]
    (run / "rollout" / "1.jsonl").write_text("\n".join(json.dumps(r) for r in gen))
    (run / "rollout" / "2.jsonl").write_text(json.dumps({"input": "c", "output": "~", "score": -1.0}))
    got = pt.mask_vs_j(run, 96)
    assert got["steps"][1] == {"silenced": 2, "silenced_j": 1, "j_positive": 2}
    assert got["steps"][2] == {"silenced": 1, "silenced_j": 1, "j_positive": 0}
    assert got["precision"] == pytest.approx(2 / 3) and got["recall"] == pytest.approx(2 / 2)
