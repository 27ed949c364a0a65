"""Answer equivalence: math-verify with per-route tolerance, exact numbers, and the cases where math-verify is wrong."""

from __future__ import annotations

from fractions import Fraction

import math_verify
import pytest

from stapo_verl.rewards.equivalence import (
    EXACT,
    RELATIVE_1E4,
    answers_equivalent,
    get_tolerance,
    numbers_equal,
    parse_answer,
    plain_number,
    prepare_answer,
)


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "\\frac34", True),
        ("(1,2]", "(1, 2]", True),
        ("[1,2]", "(1,2]", False),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("3\\sqrt{2}", "\\sqrt{18}", True),
        ("10\\text{ cm}", "10", True),
        ("90^\\circ", "90", True),
        ("2,125", "2125", True),
        ("27", "27.0", True),
        ("05", "5", True),
        ("x \\in [0, 1)", "[0,1)", True),
        ("\\frac{1}{2 n+2}", "$\\frac{1}{2 n+2}$", True),
        ("7", "8", False),
        ("\\frac{10}{2}", "5", True),
        ("7,5,3", "3, 5, 7", True),  # sets are unordered
        ("20\\%", "20", True),  # a final percent sign is dropped on both sides
        ("20\\%", "0.2", False),
        ("E_{1}, E_{2}", "E_{1},E_{2}", True),  # unparsable: the same text up to spaces
        ("np.arcsin(10/13)", "np.arcsin(10/13)", True),
        # the false positives of the earlier number fast path (lists glued, text after "=" only)
        ("357", "3, 5, 7", False),
        ("1,2", "12", False),
        ("1", "0,1", False),
        ("3x + 4y + 14=0", "3x-y+13=0", False),
        ("x^2 = 4", "x = 4", False),
        # math-verify's evalf(chop=True) calls 1/2006! - 1/2004! zero: exact numbers are compared exactly
        ("\\frac{1}{2006!}", "\\frac{1}{2004!}", False),
        ("\\frac{1}{2004!}", "\\frac{1}{2004!}", True),
        # math-verify's fragment search reads 2/3 and 2 out of these (Minerva golds with one digit changed)
        ("\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", False),
        ("\\hbar \\omega(v+2 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}",
         "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", False),
        # exact routes: decimals are exact values
        ("0.333333", "\\frac{1}{3}", False),
        ("0.0000002", "0.0000001", False),
        ("x=0.0000002", "x=0.0000001", False),  # float_rounding=10 inside symbolic answers
        ("\\pi/4", "0.785398", False),
        ("\\sqrt{2}/2", "\\frac{1}{\\sqrt{2}}", True),
    ],
)
def test_exact_route(pred, gold, equal):
    assert answers_equivalent(pred, gold, EXACT) is equal


def test_math_verify_default_rounding_is_what_the_exact_route_overrides():
    """The false positives the route's tolerance removes are math-verify's own at its defaults."""
    def mv(pred, gold):
        parse = lambda s: math_verify.parse("\\boxed{" + s + "}", parsing_timeout=None)  # noqa: E731
        return math_verify.verify(parse(gold), parse(pred), timeout_seconds=None)

    assert mv("\\frac{1}{2006!}", "\\frac{1}{2004!}") is True
    assert mv("0.0000002", "0.0000001") is True
    assert mv("\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}") is True
    assert mv("4.5\\times 10^{33}", "4.5e33") is False  # 4.5e33 read as 4.5*e*33


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("0.0000002", "0.0000001", False),
        ("4.5\\times 10^{33}", "4.5e33", True),
        ("4.5004e33", "4.5e33", True),  # relative error 9e-5
        ("4.51e33", "4.5e33", False),  # relative error 2e-3
        ("1.6", "1.6", True),
        ("1.60016", "1.6", True),
        ("1.6002", "1.6", False),
        ("1.0000001e-7", "1e-7", True),
        ("1414.2", "1000\\sqrt{2}", True),
        ("1.41", "\\sqrt{2}", False),
    ],
)
def test_minerva_relative_tolerance(pred, gold, equal):
    assert answers_equivalent(pred, gold, RELATIVE_1E4) is equal


def test_prepare_answer():
    assert prepare_answer("  $\\frac{1}{2}$ ") == "\\frac{1}{2}"
    assert prepare_answer("4.5e33") == "4.5\\times 10^{33}"
    assert prepare_answer("1E-7") == "1\\times 10^{-7}"
    assert prepare_answer("20\\%") == "20" and prepare_answer("20 %") == "20"
    assert prepare_answer("\\%") == "\\%"
    assert prepare_answer("e^{2}") == "e^{2}"


def test_plain_numbers_are_exact_rationals():
    assert plain_number("05") == plain_number("5.0") == Fraction(5)
    assert plain_number(".5") == Fraction(1, 2) and plain_number("-2.50") == Fraction(-5, 2)
    assert plain_number("4.5e33") == Fraction(45 * 10**32)
    for text in ("1,000", "1 2", "3, 5, 7", "x", "\\frac12", "1e", ""):
        assert plain_number(text) is None, text
    assert numbers_equal(Fraction(1), Fraction(10001, 10000), RELATIVE_1E4)
    assert not numbers_equal(Fraction(1), Fraction(10002, 10000), RELATIVE_1E4)
    assert not numbers_equal(Fraction(1), Fraction(10001, 10000), EXACT)


def test_parse_is_whole_answer_or_nothing():
    assert isinstance(parse_answer("\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}")[0], str)
    assert parse_answer("2**10")[0].doit() == 1024
    assert parse_answer("\\frac12")[0] == Fraction(1, 2)


def test_bad_input_is_an_error():
    with pytest.raises(TypeError, match="pred and gold must be str, got int and str"):
        answers_equivalent(5, "5")
    with pytest.raises(TypeError, match="tolerance must be a Tolerance"):
        answers_equivalent("5", "5", "exact")
    with pytest.raises(ValueError, match=r"tolerance='loose' is unknown; allowed: \['exact', 'relative_1e-4'\]"):
        get_tolerance("loose")
