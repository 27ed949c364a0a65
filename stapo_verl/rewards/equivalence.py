"""Is a predicted answer equal to the gold answer? math-verify, with a numeric tolerance chosen per route.

:func:`answers_equivalent` decides, in this order:

1. **Identical strings** (after :func:`prepare_answer`): equal. Exact by construction; it also covers golds that
   math-verify cannot parse (Minerva's ``np.arcsin(10/13)``).
2. **Both plain numbers** (:func:`plain_number`: one decimal number such as ``05``, ``-2.50``, ``.5``, ``4.5e33``; no
   thousands separators, list commas, relations or LaTeX): compared as exact rationals under the route's
   :class:`Tolerance`. Anything else, ``1,000`` and ``3, 5, 7`` included, goes to math-verify.
3. **math-verify**: :func:`parse_answer` on both sides (the whole answer, or nothing: math-verify's fragment search
   is off). An answer it cannot parse equals only the same text up to spaces. When both parse to numbers (or to sets/tuples of numbers), the route's tolerance decides (:func:`numbers_verdict`):
   exact rationals are compared exactly, so ``\\frac{1}{2006!}`` is not ``\\frac{1}{2004!}`` (math-verify's
   ``evalf(chop=True)`` calls their difference 0); other numbers (radicals, ``\\pi``) must satisfy math-verify *and* agree
   to 40 significant digits. Everything else is ``math_verify.verify(gold, pred, float_rounding=...)``.

So the only answers accepted without math-verify are ones math-verify accepts too, except where math-verify itself is
wrong; those cases are listed here and handled the same way by the reference of the differential test:

* its fragment search (``extraction_mode="any_match"``, the default of ``parse``) reads ``2/3`` out of
  ``\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}`` and ``2`` out of ``\\hbar \\omega(v+1 / 2)-...``: the whole answer is parsed or
  nothing is (:func:`parse_answer`);
* ``float_rounding=6`` (its default) makes ``0.0000002`` equal ``0.0000001``: numbers use the route's tolerance;
* ``evalf(chop=True)`` makes ``1/2006!`` equal ``1/2004!``: exact numbers are compared exactly;
* ``4.5e33`` (Minerva's gold notation) parses as ``4.5·e·33``: :func:`prepare_answer` writes it ``4.5\\times 10^{33}``;
* ``20\\%`` does not parse (latex2sympy2_extended 1.11.0's parser, generated for antlr 4.13, lacks
  ``AtomContext.FUNC_GAMMA`` under the antlr 4.9.3 runtime that hydra pins): :func:`prepare_answer` drops a final
  percent sign on both sides, as verl's ``math_reward.strip_string`` does (``20\\%`` = ``20``; ``20\\%`` is not ``0.2``).

Tolerances (:data:`TOLERANCES`; which route uses which is in :mod:`stapo_verl.rewards.routing`):

* :data:`EXACT` for competition answers (AIME, AMC, MATH, GSM8K, OlympiadBench, DAPO): they are exact integers,
  fractions, radicals; a decimal is its exact value (``0.5`` = ``\\frac{1}{2}``, ``0.333333`` is not ``\\frac{1}{3}``).
  Floats inside symbolic answers are compared by math-verify at 10 decimals (its default 6 accepts ``x=0.0000002``
  for ``x=0.0000001``).
* :data:`RELATIVE_1E4` for Minerva: its answers are physical quantities (``4.5e33`` erg/s, ``0.006`` m) written to a
  few significant figures, for which decimal places mean nothing (``1e-7`` vs ``2e-7`` differ in the 7th decimal).
  Relative tolerance 1e-4 is that of the harness the Minerva file comes from (Qwen2.5-Math ``evaluation/grader.py``,
  ``numeric_equal``: ``isclose(reference, prediction, rel_tol=1e-4)``,
  https://github.com/QwenLM/Qwen2.5-Math/blob/main/evaluation/grader.py).

math-verify's own ``signal.alarm`` timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``): they
fail outside the main thread; the killable workers of :mod:`stapo_verl.rewards.timeout` bound every call instead.
math-verify is imported on first use, so importing this module costs nothing. Its "timeout disabled" warning is
silenced through two private module globals, an entry of :mod:`stapo_verl.rewards.ledger` checked before they are set.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from fractions import Fraction
from types import MappingProxyType

from stapo_verl.rewards import ledger

__all__ = [
    "EXACT",
    "RELATIVE_1E4",
    "TOLERANCES",
    "Tolerance",
    "answers_equivalent",
    "get_tolerance",
    "numbers_equal",
    "numbers_verdict",
    "parse_answer",
    "plain_number",
    "prepare_answer",
]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How numbers are compared on a route.

    Attributes:
        name: key in :data:`TOLERANCES` (what routes and workers pass around).
        rel_tol: ``None`` = exact; else ``|a - b| <= rel_tol * max(|a|, |b|)``.
        float_rounding: math-verify's ``float_rounding`` (decimal places) for floats inside non-numeric answers.
    """

    name: str
    rel_tol: Fraction | None
    float_rounding: int


EXACT = Tolerance("exact", None, 10)
RELATIVE_1E4 = Tolerance("relative_1e-4", Fraction(1, 10_000), 6)
#: name → :class:`Tolerance` (read-only)
TOLERANCES = MappingProxyType({t.name: t for t in (EXACT, RELATIVE_1E4)})

#: LaTeX spellings with one meaning: ``\\dfrac``/``\\tfrac`` are ``\\frac``; ``\\left``/``\\right`` before a delimiter
#: and the spacing commands ``\\!``, ``\\,``, ``\\;``, ``\\:`` only change typesetting.
_SYNONYMS = re.compile(r"\\[dt]frac(?![A-Za-z])|\\(?:left|right)(?=[()\[\]|.]|\\[{}|])|\\[!,;:]")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_SCI = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?\d+)")
_PERCENT = re.compile(r"(.*?)\s*\\?%")
#: Significant digits two non-rational numbers must share (in addition to math-verify's verdict) on exact routes.
_IRRATIONAL_DIGITS = 40


def get_tolerance(name: str) -> Tolerance:
    """The :class:`Tolerance` called ``name``.

    Raises:
        ValueError: unknown name (the message lists the allowed ones).
    """
    if name not in TOLERANCES:
        raise ValueError(f"tolerance={name!r} is unknown; allowed: {sorted(TOLERANCES)}")
    return TOLERANCES[name]


def _math_verify():
    """The ``math_verify`` module, with its one-time 'timeout disabled' warning marked as shown (calls are bounded
    by the killable workers instead). Imported here, not at module level, so that importing this module costs
    nothing; after the first call the imports are look-ups in ``sys.modules``.

    The flags are private module globals of math-verify (:data:`stapo_verl.rewards.ledger.MATH_VERIFY_PATCHES`): the
    installed math-verify is checked against the ledger before they are first set in a process (afterwards they stay
    set, and a worker forked from a checked fork server inherits them).

    Raises:
        stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the installed math-verify differs from the one the
            ledger was written for, and ``STAPO_ALLOW_UNSUPPORTED_VERL`` is not ``1``.
    """
    import math_verify
    import math_verify.grader
    import math_verify.parser

    if not (getattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
            and getattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)):
        ledger.check(ledger.MATH_VERIFY_PATCHES, ledger.MATH_VERIFY_WRITTEN_FOR)
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def _synonym(match: re.Match) -> str:
    return "\\frac" if match.group().endswith("frac") else ""


def prepare_answer(answer: str) -> str:
    """Clean-ups applied to both sides before anything else (see the module docstring for why each is needed).

    * surrounding whitespace and one pair of surrounding ``$`` (OlympiadBench writes ``$\\frac{1}{2}$``);
    * LaTeX spellings with one meaning: ``\\dfrac``/``\\tfrac`` → ``\\frac``, ``\\left(`` → ``(``, spacing commands
      removed (math-verify normalises these too; here they also make answers it cannot parse comparable);
    * a number in e-notation (``4.5e33``, ``1E-7``) becomes ``4.5\\times 10^{33}``;
    * a final percent sign (``20\\%``, ``20%``) is dropped.

    Args:
        answer: a box content, an ``Answer:`` line or a gold answer.

    Returns:
        The cleaned string.
    """
    s = answer.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s.strip("$").strip()
    s = _SYNONYMS.sub(_synonym, s)
    pct = _PERCENT.fullmatch(s)
    if pct and pct.group(1):
        s = pct.group(1)
    sci = _SCI.fullmatch(s)
    if sci:
        s = f"{sci.group(1)}\\times 10^{{{sci.group(2)}}}"
    return s


def plain_number(text: str) -> Fraction | None:
    """``text`` as an exact rational if it is one plain decimal number, else None.

    Accepted: optional sign, digits with an optional decimal point, optional e-exponent (``05``, ``-2.50``,
    ``.5``, ``4.5e33``). Not accepted: thousands separators, spaces, LaTeX, several numbers (``1,000``, ``1 2``,
    ``3, 5, 7``), which go to math-verify.
    """
    s = text.strip()
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    return Fraction(s)


def numbers_equal(a: Fraction, b: Fraction, tolerance: Tolerance) -> bool:
    """Exact (``rel_tol is None``) or relative comparison of two rationals."""
    if tolerance.rel_tol is None:
        return a == b
    return abs(a - b) <= tolerance.rel_tol * max(abs(a), abs(b))


def parse_answer(answer: str) -> list:
    """math-verify's parse of one *whole* answer string (after :func:`prepare_answer`).

    ``math_verify.parse("\\boxed{" + answer + "}", extraction_mode="first_match")``: only the box content as a
    whole is parsed (LaTeX); math-verify's default ``"any_match"`` goes on to any fragment it can parse when the
    whole fails, so ``\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}`` (latex2sympy cannot read ``E_{1}``) becomes ``2/3`` and
    equals ``\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}``. When the LaTeX parse fails, the text as a plain expression
    (``2**10``) is used only if math-verify's match covers the whole text.

    Returns:
        math-verify's list ``[parsed, string]``; ``parsed`` is a str when nothing parsed (compared as text).

    Raises:
        stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the installed math-verify is not the one the ledger
            was written for (:func:`_math_verify`).
    """
    mv = _math_verify()
    parsed = mv.parse("\\boxed{" + answer + "}", extraction_config=(mv.LatexExtractionConfig(),),
                      parsing_timeout=None, extraction_mode="first_match")
    if not parsed or isinstance(parsed[0], str):
        expr = mv.parse(answer, extraction_config=(mv.ExprExtractionConfig(),), parsing_timeout=None,
                        extraction_mode="first_match")
        if len(expr) == 2 and not isinstance(expr[0], str) and _squash(expr[1]) == _squash(answer):
            return expr
    return parsed or [answer]


def _squash(text: str) -> str:
    return "".join(text.split())


def _as_number(expr):
    """A finite sympy number with Floats replaced by their exact decimal value, or None."""
    import sympy

    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    try:
        exact = expr.xreplace({f: sympy.Rational(str(f)) for f in expr.atoms(sympy.Float)}).doit()
    except Exception:  # noqa: BLE001 - sympy raises many types on odd input; such answers go to math-verify
        return None
    if exact.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo) or exact.is_finite is False:
        return None
    return exact


def _sympy_numbers_equal(a, b, tolerance: Tolerance, mv_says: bool) -> bool | None:
    import sympy

    if a.is_Rational and b.is_Rational:
        return numbers_equal(Fraction(int(a.p), int(a.q)), Fraction(int(b.p), int(b.q)), tolerance)
    digits = _IRRATIONAL_DIGITS + 10
    try:
        diff = abs(sympy.N(a - b, digits))
        scale = max(abs(sympy.N(a, digits)), abs(sympy.N(b, digits)))
    except Exception:  # noqa: BLE001
        return None
    if not (diff.is_number and scale.is_number and diff.is_finite and scale.is_finite):
        return None
    if tolerance.rel_tol is None:
        return bool(mv_says and diff <= scale * sympy.Rational(1, 10**_IRRATIONAL_DIGITS))
    return bool(diff <= scale * sympy.Rational(tolerance.rel_tol.numerator, tolerance.rel_tol.denominator))


def numbers_verdict(gold, pred, tolerance: Tolerance, mv_says: bool = True) -> bool | None:
    """The route's verdict when both parsed answers are numbers (or sets/tuples of numbers), else None.

    Args:
        gold, pred: first elements of :func:`parse_answer` results (sympy objects or strings).
        tolerance: the route's :class:`Tolerance`.
        mv_says: math-verify's verdict; on :data:`EXACT` routes a non-rational pair must also satisfy it.

    Returns:
        True/False when both are numbers, both ``FiniteSet`` s or both ``Tuple`` s of numbers of the same length
        (sets are paired in increasing order, tuples position by position); None otherwise (math-verify decides).
    """
    import sympy

    if isinstance(gold, (sympy.FiniteSet, sympy.Tuple)) and type(gold) is type(pred):
        g_items, p_items = list(gold.args), list(pred.args)
        if len(g_items) != len(p_items) or not g_items:
            return None
        g_nums, p_nums = [_as_number(x) for x in g_items], [_as_number(x) for x in p_items]
        if any(x is None for x in g_nums + p_nums):
            return None
        if isinstance(gold, sympy.FiniteSet):
            try:
                g_nums = sorted(g_nums, key=lambda x: complex(sympy.N(x, 30)).real)
                p_nums = sorted(p_nums, key=lambda x: complex(sympy.N(x, 30)).real)
            except (TypeError, ValueError):
                return None
        verdicts = [_sympy_numbers_equal(g, p, tolerance, mv_says) for g, p in zip(g_nums, p_nums)]
        return None if any(v is None for v in verdicts) else all(verdicts)
    g, p = _as_number(gold), _as_number(pred)
    if g is None or p is None:
        return None
    return _sympy_numbers_equal(g, p, tolerance, mv_says)


def answers_equivalent(pred: str, gold: str, tolerance: Tolerance = EXACT) -> bool:
    """Whether the predicted answer equals the gold answer (box contents, no ``\\boxed``).

    Not cached: a process-wide cache would be state that outlives the call (a verdict could come from before
    math-verify was replaced or reconfigured in the process); repeated plain numbers take the fast path anyway.

    Args:
        pred: predicted answer, e.g. ``"\\frac{1}{2}"``.
        gold: gold answer, e.g. ``"0.5"``.
        tolerance: the route's :class:`Tolerance` (:data:`EXACT` or :data:`RELATIVE_1E4`).

    Returns:
        The verdict of the steps in the module docstring. Symbolic checks can run for a long time on adversarial
        input: call through :class:`stapo_verl.rewards.timeout.KillableRunner`.

    Raises:
        TypeError: ``pred`` or ``gold`` is not a str; ``tolerance`` is not a :class:`Tolerance`.
        stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the installed math-verify is not the one the ledger
            was written for (:func:`_math_verify`).
    """
    if not isinstance(pred, str) or not isinstance(gold, str):
        raise TypeError(f"pred and gold must be str, got {type(pred).__name__} and {type(gold).__name__}")
    if not isinstance(tolerance, Tolerance):
        raise TypeError(f"tolerance must be a Tolerance (one of {sorted(TOLERANCES)}), got {tolerance!r}")
    p, g = prepare_answer(pred), prepare_answer(gold)
    if p == g:
        return True
    a, b = plain_number(p), plain_number(g)
    if a is not None and b is not None:
        return numbers_equal(a, b, tolerance)
    gold_parsed, pred_parsed = parse_answer(g), parse_answer(p)
    if isinstance(gold_parsed[0], str) or isinstance(pred_parsed[0], str):
        # math-verify could not parse one side: only the same text counts (LaTeX ignores spaces in math mode)
        return _squash(p) == _squash(g)
    mv = _math_verify()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mv_says = bool(mv.verify(gold_parsed, pred_parsed, float_rounding=tolerance.float_rounding,
                                 timeout_seconds=None))
    verdict = numbers_verdict(gold_parsed[0], pred_parsed[0], tolerance, mv_says)
    return mv_says if verdict is None else verdict
