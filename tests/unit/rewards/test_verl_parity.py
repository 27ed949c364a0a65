"""The copies in ``stapo_verl.rewards.verl_rules`` behave exactly like verl's functions they copy, and the box
extractor agrees with verl's ``math_reward.last_boxed_only_string`` wherever verl's function finds one box form.

Inputs: the vendored gold answers of the eight datasets (every 7th of DAPO-Math-17k's integers), each with four
perturbations, plus edge cases (``$`` runs, trailing ``\\frac``/``\\sqrt``, two ``\\text{ ``, units, ``=``, lists)."""

from __future__ import annotations

import itertools

import pytest
from verl.utils.reward_score import math_dapo, math_reward

from stapo_verl.rewards import verl_rules
from stapo_verl.rewards.extract import final_box_answer
from support.data_benchmarks import DATASETS, gold_rows
from support.rewards_perturb import perturbations

EDGE = ["", " ", "$", "$$", "$5$", "\\$5", "a $x$ b $y$ c", "\\frac", "\\frac1", "\\sqrt", "x\\sqrt", "\\frac12",
        "\\fracab", "\\sqrt3", "3/4", "a/b", "12/x", "0.5", ".5", " .5", "{.5}", "k = 4", "x=y=3", "5\\text{ cm}",
        "\\text{ a}\\text{ b}", "10 \\text{ dollars}", "1,000", "1,2", "3, 5, 7", "20\\%", "20\\\\%", "90^\\circ",
        "90^{\\circ}", "\\left( 3, \\frac{\\pi}{2} \\right)", "\\dfrac{1}{2}", "\\tfrac12", "\\boxed{5}",
        "\\textbf{7}", "\\overline{12}", "an answer", "a b c", "x\n=\n4", "\\mbox{m}", "5\\;\\text{m}", "1{,}000"]


def _inputs() -> list[str]:
    out = list(EDGE)
    for name in DATASETS:
        golds = [g for _, _, g in gold_rows(name)]
        step = 1 if name != "dapo-math-17k" else 7  # DAPO's golds are all integers: every 7th is enough
        for i in range(0, len(golds), step):
            out.append(golds[i])
            out.extend(a for _, a in perturbations(golds[i], golds[i - 1])[:4])
    return list(dict.fromkeys(out))


INPUTS = _inputs()


def _same(fn_ours, fn_verl, text):
    """Same return value, or the same exception type."""
    try:
        expected = fn_verl(text)
    except Exception as exc:  # noqa: BLE001 - verl's own functions raise on some inputs
        with pytest.raises(type(exc)):
            fn_ours(text)
        return
    assert fn_ours(text) == expected, text


def test_enough_inputs():
    assert len(INPUTS) > 6000


def test_normalize_final_answer_is_verls():
    for text in INPUTS:
        _same(verl_rules.normalize_final_answer, math_dapo.normalize_final_answer, text)


def test_strip_string_is_verls():
    for text in INPUTS:
        _same(verl_rules.strip_string, math_reward.strip_string, text)


def test_constants_are_verls():
    assert list(verl_rules.SUBSTITUTIONS) == math_dapo.SUBSTITUTIONS
    assert list(verl_rules.REMOVED_EXPRESSIONS) == math_dapo.REMOVED_EXPRESSIONS
    import inspect

    default = inspect.signature(math_dapo.is_correct_minerva).parameters["answer_pattern"].default
    assert verl_rules.DAPO_ANSWER_PATTERN == default
    assert "solution_str[-300:]" in inspect.getsource(math_dapo.compute_score)


@pytest.mark.parametrize("wrap", ["\\boxed{%s}", "so \\fbox{%s}.", "$\\boxed %s$.", "text \\boxed{%s} more text"])
def test_box_extraction_agrees_with_verls_math_reward(wrap):
    """Where verl's ``last_boxed_only_string`` finds a box, the content is the same as ours."""
    checked = 0
    for answer in itertools.islice((a for a in INPUTS if "$" not in a and "\\boxed" not in a and "{" not in a[:1]),
                                   3000):
        if wrap.startswith("$\\boxed ") and (not answer.strip() or answer != answer.strip() or "\n" in answer
                                             or answer.endswith(".")):
            continue
        text = wrap % answer
        verl_box = math_reward.last_boxed_only_string(text)
        if verl_box is None:
            continue
        if verl_box.startswith("\\boxed "):  # brace-less: verl keeps up to the next "$"
            verl_content = verl_box[len("\\boxed "):].strip()
        else:
            verl_content = verl_box[verl_box.index("{") + 1:-1]
        assert final_box_answer(text) == verl_content, text
        checked += 1
    assert checked > 1000
