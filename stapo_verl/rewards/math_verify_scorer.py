"""Equivalence scorer for evaluation benchmarks with LaTeX answers, built on HuggingFace ``math-verify``.

Used for AIME24/25, AMC23, MATH500, Minerva, OlympiadBench and GSM8K (spec §6.2, A16: rule-based accuracy is the
primary in-house metric). The prediction is the content of the last complete ``\\boxed{}`` anywhere in the
response (the prompt asks for it; :func:`stapo_verl.rewards.dapo.find_last_boxed`); a response without one is
wrong. Gold and prediction are parsed with ``math_verify.parse`` (LaTeX first, then plain expressions) and compared
with ``math_verify.verify`` (symbolic equality, fractions, intervals, sets/tuples, ``\\text{}`` and units handled by
math-verify's normalisation; numbers compared after rounding to 6 digits).

Fast paths accept strings identical up to whitespace, strings equal after verl's MATH normaliser
``math_reward.strip_string`` (``\\dfrac`` = ``\\frac``, ``20\\%`` = ``20``) and equal plain numbers (``1,000`` = ``1000`` =
``1000.0`` = ``01000``, ``4.5\\times 10^{33}`` = ``4.5e33``) without sympy; any other outcome is decided by math-verify,
so the fast paths never make the scorer stricter. The percent fast path is needed: with the antlr 4.9 runtime that
hydra pins, latex2sympy2_extended 1.11.0 cannot parse ``20\\%`` (its generated 4.9.3 parser lacks
``AtomContext.FUNC_GAMMA``), so math-verify alone compares it as an unparsed string.

math-verify's own ``signal.alarm`` timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``):
they fail in threads, and the hard timeout of :mod:`stapo_verl.rewards.timeout` is the single, counted mechanism.
"""

from __future__ import annotations

import warnings

from stapo_verl.rewards.dapo import extract_boxed_answer
from stapo_verl.rewards.normalize import as_number, strip_string

__all__ = ["answers_equivalent", "as_number", "score_math_verify"]

_mv = None


def _math_verify():
    """Import math-verify lazily and silence its one-time 'timeout disabled' warning (we time out ourselves)."""
    global _mv
    if _mv is None:
        import math_verify
        import math_verify.grader
        import math_verify.parser

        math_verify.parser.TIMEOUT_WARNING_SHOWN = True
        math_verify.grader.TIMEOUT_WARNING_SHOWN = True
        _mv = math_verify
    return _mv


def _parse(text: str):
    mv = _math_verify()
    configs = (mv.LatexExtractionConfig(), mv.ExprExtractionConfig())
    parsed = mv.parse("\\boxed{" + text + "}", extraction_config=configs, parsing_timeout=None)
    if not parsed:  # e.g. Minerva's ``4.5e33`` or ``np.arcsin(10/13)``: not LaTeX, try it as a plain expression
        parsed = mv.parse(text, extraction_config=(mv.ExprExtractionConfig(),), parsing_timeout=None)
    return parsed


def answers_equivalent(pred: str, gold: str) -> bool:
    """Whether two answer strings (box contents, no ``\\boxed``) are equivalent.

    Args:
        pred: predicted answer, e.g. ``"\\frac{1}{2}"``.
        gold: reference answer, e.g. ``"0.5"`` or OlympiadBench's ``"$(2,4)$"`` (outer ``$`` are stripped).

    Returns:
        True if identical up to whitespace, equal as plain numbers, or if
        ``math_verify.verify(parse(gold), parse(pred))`` holds.
        May run for a long time on adversarial input: call through the timeout runner.
    """
    gold = gold.strip()
    if len(gold) >= 2 and gold[0] == "$" and gold[-1] == "$":
        gold = gold.strip("$").strip()
    if "".join(pred.split()) == "".join(gold.split()):
        return True  # identical up to spaces: skip sympy, whose symbolic checks can exceed the timeout under load
    if strip_string(pred) == strip_string(gold):
        return True  # equal after verl's MATH normaliser: \dfrac = \frac, 20\% = 20 (math-verify misses the %)
    a, b = as_number(pred), as_number(gold)
    if a is not None and b is not None and a == b:
        return True
    gold_parsed = _parse(gold)
    pred_parsed = _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(_math_verify().verify(gold_parsed, pred_parsed, timeout_seconds=None))


def score_math_verify(solution_str: str, ground_truth: str) -> dict:
    """Score one response against a benchmark answer (±1).

    Args:
        solution_str: decoded response text.
        ground_truth: reference answer string (prepared parquet ``reward_model.ground_truth``).

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str, "timeout": False, "no_box": bool}``; ``pred`` is the raw
        content of the last box ("" when there is none).
    """
    boxed = extract_boxed_answer(solution_str, tail_chars=None)
    if boxed is None:
        return {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    correct = answers_equivalent(boxed, str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": boxed, "timeout": False, "no_box": False}
