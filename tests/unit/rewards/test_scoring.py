"""compute_score in-process (``timeout_s=0``): routing, the strict DAPO rules, the benchmark scorer, and every input
of the public bug reports with its expected verdict. The same inputs go through verl's reward-loop managers and
the killable workers in ``tests/integration/rewards/test_reward_loop.py``."""

from __future__ import annotations

import pytest

from stapo_verl.rewards import (
    DAPO_FORMAT,
    MATH_VERIFY,
    RESULT_KEYS,
    STRICT_BOX,
    UnknownDataSourceError,
    compute_score,
    route_for,
    score_strict_box,
    scorer_for,
)
from stapo_verl.rewards.verl_rules import normalize_final_answer
from support.rewards_reported import PAD, REPORTED


@pytest.mark.parametrize(("source", "response", "gold", "acc"), REPORTED)
def test_reported_inputs(source, response, gold, acc):
    out = compute_score(source, response, gold, timeout_s=0)
    assert out["acc"] is acc and out["score"] == (1.0 if acc else -1.0), out
    assert set(out) == set(RESULT_KEYS)


def test_routes_and_tolerances():
    assert route_for("MATH_DAPO").scorer == DAPO_FORMAT and scorer_for("dapo-math-17k") == STRICT_BOX
    assert route_for("math").scorer == MATH_VERIFY and route_for("aime2026").scorer == MATH_VERIFY
    assert route_for("minerva").tolerance == "relative_1e-4"
    assert {route_for(s).tolerance for s in ("math500", "aime24", "amc23", "olympiadbench", "gsm8k", "math_dapo",
                                             "dapo-math-17k", "openai/gsm8k")} == {"exact"}


def test_uniform_keys_and_data_source():
    outs = [
        compute_score("math_dapo", "\\boxed{34}", "34", timeout_s=0),
        compute_score("DAPO-17k", "no box", "34", timeout_s=0),
        compute_score("math500", "\\boxed{\\frac12}", "0.5", timeout_s=0),
        compute_score("aime2026", "\\boxed{025}", "25", timeout_s=0),
        compute_score("gsm8k", "\\boxed{2,125}", 2125, extra_info={"split": "test"}, reward_router_address=None,
                      timeout_s=0),
    ]
    assert all(set(o) == set(RESULT_KEYS) for o in outs)
    assert [o["data_source"] for o in outs] == ["math_dapo", "DAPO-17k", "math500", "aime2026", "gsm8k"]
    assert [o["acc"] for o in outs] == [True, False, True, True, True]
    assert [o["score"] for o in outs] == [1.0, -1.0, 1.0, 1.0, 1.0]
    assert outs[1]["no_box"] is True and outs[0]["no_box"] is False


def test_bad_arguments_are_errors_naming_the_value():
    with pytest.raises(UnknownDataSourceError, match=r"data_source='gpqa'.*allowed.*math500"):
        compute_score("gpqa", "\\boxed{1}", "1", timeout_s=0)
    with pytest.raises(UnknownDataSourceError, match=r"scorer='nope' is unknown"):
        compute_score("math500", "\\boxed{1}", "1", scorer="nope", timeout_s=0)
    with pytest.raises(UnknownDataSourceError, match=r"tolerance='loose' is unknown"):
        compute_score("math500", "\\boxed{1}", "1", tolerance="loose", timeout_s=0)
    with pytest.raises(UnknownDataSourceError, match=r"scorer='strict_box' compares exactly"):
        compute_score("math500", "\\boxed{1}", "1", scorer="strict_box", tolerance="relative_1e-4", timeout_s=0)
    with pytest.raises(ValueError, match="timeout_s must be >= 0, got -1"):
        compute_score("math500", "\\boxed{1}", "1", timeout_s=-1)


def test_forced_scorer_and_tolerance():
    # The strict scorer does not accept what only math-verify accepts.
    assert not compute_score("math_dapo", "\\boxed{\\frac{2}{4}}", "0.5", timeout_s=0)["acc"]
    assert compute_score("math_dapo", "\\boxed{\\frac{2}{4}}", "0.5", scorer="math_verify", timeout_s=0)["acc"]
    assert not compute_score("math_dapo", PAD + "\nAnswer: 42", "42", scorer="strict_box", timeout_s=0)["acc"]
    assert compute_score("math500", "\\boxed{1.00005}", "1", tolerance="relative_1e-4", timeout_s=0)["acc"]
    assert not compute_score("math500", "\\boxed{1.00005}", "1", timeout_s=0)["acc"]


# ---------------------------------------------------------------- strict box (training reward)


def test_strict_box_window_is_300_characters():
    from verl.utils.reward_score import math_dapo  # verl's own scorer, for the comparison

    resp = PAD + "\\boxed{34}" + " Double-checked, and every step above is consistent with the constraints." * 2
    assert 100 < len(resp) - resp.index("\\boxed{") < 300
    assert math_dapo.compute_score(resp, "34", strict_box_verify=True)["score"] == -1.0  # verl re-slices to 100
    assert score_strict_box(resp, "34") == {"score": 1.0, "acc": True, "pred": "34", "timeout": False,
                                            "no_box": False}
    late = score_strict_box("\\boxed{34}" + PAD, "34")
    assert late["no_box"] and late["score"] == -1.0


STRICT_ROUTES = ["math_dapo", "dapo-math-17k"]


@pytest.mark.parametrize("route", STRICT_ROUTES + ["math"])
@pytest.mark.parametrize(
    ("pred", "gold"),
    [("\\dfrac{1}{2}", "\\frac{1}{2}"), ("\\tfrac{1}{2}", "\\frac{1}{2}"), ("\\tfrac12", "\\frac{1}{2}"),
     ("20\\%", "20"), ("5.0", "5"), ("05", "5"), ("5", "5.0"), ("1,000", "1000"), ("34^\\circ", "34")],
)
def test_equivalent_notations_score_correct(route, pred, gold):
    out = compute_score(route, PAD + f"so the answer is $\\boxed{{{pred}}}$.", gold, timeout_s=0)
    assert out["score"] == 1.0 and out["acc"] is True, (route, pred, gold, out)


@pytest.mark.parametrize("route", STRICT_ROUTES)
@pytest.mark.parametrize(
    "resp",
    [
        "\\boxed{5.1}", "\\boxed{50}", "\\boxed{-5}", "\\boxed{0.5}", "\\boxed{2\\%}",
        "\\boxed{\\frac{10}{2}}",  # equal value, not an equal string: only math-verify accepts this
        "\\boxed{5} wait, the final answer is \\boxed{6}",  # the last box counts
        "\\boxed{5}" + PAD,  # closed more than 300 characters before the end
        "\\boxed{5} then \\boxed{5",  # truncated last box: no answer
        "\\boxed{6}, \\boxed{5}",  # a hedge is read as the list "6, 5"
        "\\boxed{5,0}",  # verl's normaliser glues it into "50"... and math-verify rejects the list
    ],
)
def test_strict_routes_stay_strict(route, resp):
    out = compute_score(route, resp, "5", timeout_s=0)
    assert out["score"] == -1.0 and out["acc"] is False, (route, resp, out)


def test_strict_match_needs_math_verify_to_agree_where_verl_normalises_lossily():
    assert normalize_final_answer("1,2") == normalize_final_answer("12") == "12"  # verl glues the list
    assert normalize_final_answer("x^2 = 4") == normalize_final_answer("x = 4")  # verl keeps the text after "="
    assert not compute_score("math_dapo", "\\boxed{1,2}", "12", timeout_s=0)["acc"]
    assert not compute_score("dapo-math-17k", "\\boxed{x^2 = 4}", "x = 4", timeout_s=0)["acc"]


# ---------------------------------------------------------------- DAPO's published answer line


def test_dapo_answer_line_follows_verl_order():
    """verl's math_dapo.verify: the Answer: line (in the last 300 characters) first, the box only without one."""
    line = PAD + "\nAnswer: 42"
    assert compute_score("math_dapo", line, "42", timeout_s=0) == {
        "score": 1.0, "acc": True, "pred": "42", "timeout": False, "no_box": False, "data_source": "math_dapo",
        "ground_truth_error": False}
    assert compute_score("math_dapo_reasoning", PAD + "\nanswer: $42$", "42", timeout_s=0)["acc"]
    assert compute_score("math_dapo", PAD + "\nAnswer: 41", "42", timeout_s=0)["score"] == -1.0
    assert compute_score("math_dapo", "\\boxed{41}\nAnswer: 42", "42", timeout_s=0)["acc"]
    assert not compute_score("math_dapo", "\\boxed{42}\nAnswer: 41", "42", timeout_s=0)["acc"]
    assert not compute_score("math_dapo", "Answer: 41\nNo, \\boxed{42}", "42", timeout_s=0)["acc"]  # verl's order
    assert compute_score("math_dapo", "Answer: \\boxed{42}", "42", timeout_s=0)["pred"] == "42"
    late = compute_score("math_dapo", "Answer: 42\n" + PAD, "42", timeout_s=0)
    assert late["no_box"] and late["score"] == -1.0
    assert compute_score("math_dapo", PAD + "\\boxed{7}", "7", timeout_s=0)["acc"]  # the box alone still works
    assert not compute_score("dapo-17k", line, "42", timeout_s=0)["acc"]  # box-only route


def test_dapo_answer_line_agrees_with_verl_where_verl_reads_it():
    """Where verl's own scorer reads a plain line, it reaches the same verdict."""
    from verl.utils.reward_score import math_dapo

    for text, gold in [(PAD + "\nAnswer: 42", "42"), (PAD + "\nAnswer: 41", "42"), (PAD + "\nAnswer: $42$", "42"),
                       ("\\boxed{41}\nAnswer: 42", "42"), ("Answer: 41\n\\boxed{42}", "42"),
                       (PAD + "\nAnswer: 1,000", "1000")]:
        assert compute_score("math_dapo", text, gold, timeout_s=0)["acc"] is math_dapo.compute_score(text, gold)["acc"]


# ---------------------------------------------------------------- benchmark scorer


def test_math_routes_to_math_verify():
    assert compute_score("math", "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", timeout_s=0)["acc"]
    assert compute_score("math", "\\boxed{(1, 2]}", "(1,2]", timeout_s=0)["acc"]
    assert not compute_score("math", "\\boxed{[1, 2]}", "(1,2]", timeout_s=0)["acc"]


def test_benchmark_scorer_needs_a_box_and_reads_the_final_one():
    out = compute_score("math500", "the answer is 5", "5", timeout_s=0)
    assert out["no_box"] and not out["acc"]
    assert compute_score("math500", "first \\boxed{4}, finally \\boxed{5}", "5", timeout_s=0)["acc"]
    assert not compute_score("math500", "\\boxed{4}, \\boxed{5}", "5", timeout_s=0)["acc"]  # a hedge: "4, 5"
    big = "x" * 100_000 + "\\boxed{34}"
    assert compute_score("math500", big, "34", timeout_s=0)["acc"]
    assert compute_score("math_dapo", big, "34", timeout_s=0)["acc"]


@pytest.mark.parametrize("gold", [None, "", "  ", float("nan"), True, ["5"]])
def test_a_missing_ground_truth_is_an_error_not_a_wrong_answer(gold):
    """A null ground truth became the string "None" and scored a correct response −1. The scorer raises; verl's
    reward function (a RewardFunction) gives the row score 0 and ``ground_truth_error=True`` instead."""
    from stapo_verl.rewards import RewardFunction
    from stapo_verl.rewards.ground_truth import GroundTruthError
    from stapo_verl.rewards.routing import compute_score as scorer

    with pytest.raises(GroundTruthError, match=r"reward_model\.ground_truth=.*data_source='math_dapo'.*Fix: "):
        scorer("math_dapo", "\\boxed{5}", gold, timeout_s=0)
    fn = RewardFunction()
    out = fn("math_dapo", "\\boxed{5}", gold, timeout_s=0)
    assert set(out) == set(RESULT_KEYS)
    assert out["score"] == 0.0 and out["ground_truth_error"] is True and out["acc"] is False
    ok = fn("math_dapo", "\\boxed{5}", "5", timeout_s=0)
    assert ok["score"] == 1.0 and ok["ground_truth_error"] is False
    assert fn("math_dapo", "\\boxed{5}", 5, timeout_s=0)["score"] == 1.0  # a number is a ground truth
