"""Reference verdict of the differential reward test: math-verify with the documented tolerance, and an exact check
where math-verify itself is wrong.

Written independently of ``stapo_verl.rewards`` (no fast paths, no extraction, no verl normalisers): it sees the
answer *text* that a test response was built around, and decides with ``math_verify.parse`` / ``math_verify.verify``.
Where math-verify is wrong, it uses an exact check instead, each case documented in
``stapo_verl/rewards/equivalence.py`` and ``docs/data_rewards_eval.md``:

* numbers: exact rationals compared exactly (math-verify's ``float_rounding=6`` makes ``0.0000002`` equal
  ``0.0000001``, its ``evalf(chop=True)`` makes ``1/2006!`` equal ``1/2004!``); Minerva: relative tolerance 1e-4;
  non-rational numbers must also agree to 40 significant digits;
* ``4.5e33`` (read by math-verify as ``4.5·e·33``) is written ``4.5\\times 10^{33}``;
* a final ``\\%`` (which latex2sympy2_extended cannot parse under the antlr 4.9.3 runtime) is dropped;
* ``\\dfrac``/``\\tfrac`` are ``\\frac``, ``\\left``/``\\right`` before a delimiter and ``\\!``, ``\\,``, ``\\;``,
  ``\\:`` are dropped (one meaning, also where math-verify cannot parse the answer);
* identical strings are equal, and an answer math-verify cannot parse equals only the same text up to spaces;
* math-verify parses the whole answer or nothing (``extraction_mode="first_match"``): its default fragment search
  reads ``2/3`` out of ``\\frac{2}{3} E_{1}+\\frac{2}{3} E_{2}``.
"""

from __future__ import annotations

import re
import warnings

import math_verify
import mpmath
import sympy

math_verify.parser.TIMEOUT_WARNING_SHOWN = True
math_verify.grader.TIMEOUT_WARNING_SHOWN = True

#: tolerance name → (relative tolerance or None for exact, math-verify float_rounding)
TOLERANCE = {"exact": (None, 10), "relative_1e-4": (mpmath.mpf("1e-4"), 6)}
_SAME = [(re.compile(r"\\[dt]frac(?![A-Za-z])"), "\\\\frac"),
         (re.compile(r"\\(?:left|right)(?=[()\[\]|.]|\\[{}|])"), ""), (re.compile(r"\\[!,;:]"), "")]
_SCI = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))[eE]([+-]?\d+)$")
_PCT = re.compile(r"^(.+?)\s*\\?%$")


def _clean(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    for pattern, repl in _SAME:
        text = pattern.sub(repl, text)
    m = _PCT.match(text)
    if m:
        text = m.group(1)
    m = _SCI.match(text)
    if m:
        text = m.group(1) + "\\times 10^{" + m.group(2) + "}"
    return text


def _parse(text: str) -> list:
    latex = math_verify.parse("\\boxed{" + text + "}", extraction_config=(math_verify.LatexExtractionConfig(),),
                              parsing_timeout=None, extraction_mode="first_match")
    if latex and not isinstance(latex[0], str):
        return latex
    expr = math_verify.parse(text, extraction_config=(math_verify.ExprExtractionConfig(),), parsing_timeout=None,
                             extraction_mode="first_match")
    if len(expr) == 2 and not isinstance(expr[0], str) and re.sub(r"\s", "", expr[1]) == re.sub(r"\s", "", text):
        return expr
    return [text]


def _exact_number(x):
    if not isinstance(x, sympy.Expr) or not x.is_number:
        return None
    try:
        value = x.subs({f: sympy.nsimplify(f, rational=True) for f in x.atoms(sympy.Float)}).doit()
    except Exception:  # noqa: BLE001
        return None
    if value.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return None
    return value


def _close(a, b, rel, mv_ok: bool) -> bool | None:
    if a.is_Rational and b.is_Rational:
        if rel is None:
            return a == b
        return abs(a - b) <= sympy.Rational(str(rel)) * max(abs(a), abs(b))
    with mpmath.workdps(60):
        try:
            xa, ya = (mpmath.mpc(*(str(part) for part in sympy.N(v, 60).as_real_imag())) for v in (a, b))
        except (TypeError, ValueError):
            return None
        diff, scale = abs(xa - ya), max(abs(xa), abs(ya))
        if rel is None:
            return mv_ok and diff <= scale * mpmath.mpf("1e-40")
        return diff <= scale * rel


def _numbers(g, p, rel, mv_ok: bool) -> bool | None:
    if isinstance(g, (sympy.FiniteSet, sympy.Tuple)) and type(g) is type(p):
        gs, ps = [_exact_number(x) for x in g.args], [_exact_number(x) for x in p.args]
        if len(gs) != len(ps) or not gs or None in gs or None in ps:
            return None
        if isinstance(g, sympy.FiniteSet):
            try:
                gs.sort(key=lambda v: float(sympy.re(sympy.N(v, 30))))
                ps.sort(key=lambda v: float(sympy.re(sympy.N(v, 30))))
            except (TypeError, ValueError):
                return None
        verdicts = [_close(a, b, rel, mv_ok) for a, b in zip(gs, ps)]
        return None if None in verdicts else all(verdicts)
    a, b = _exact_number(g), _exact_number(p)
    if a is None or b is None:
        return None
    return _close(a, b, rel, mv_ok)


def reference_equivalent(answer: str, gold: str, tolerance: str = "exact") -> bool:
    """Whether ``answer`` equals ``gold`` for the reference (module docstring).

    Args:
        answer: the answer text a response was built around (box content, ``Answer:`` line content).
        gold: the gold answer.
        tolerance: ``"exact"`` or ``"relative_1e-4"`` (Minerva).

    Raises:
        KeyError: unknown tolerance.
    """
    rel, rounding = TOLERANCE[tolerance]
    a, g = _clean(answer), _clean(gold)
    if a == g:
        return True
    ga, pa = _parse(g), _parse(a)
    if isinstance(ga[0], str) or isinstance(pa[0], str):
        return re.sub(r"\s", "", a) == re.sub(r"\s", "", g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mv_ok = bool(math_verify.verify(ga, pa, float_rounding=rounding, timeout_seconds=None))
    verdict = _numbers(ga[0], pa[0], rel, mv_ok)
    return mv_ok if verdict is None else verdict
