"""DAPO / JustRL strict final-answer scorers (training rewards, ±1).

They follow verl's ``verl.utils.reward_score.math_dapo.compute_score`` (``strict_box_verify=True`` is the reward
JustRL and STAPO train with; the default ``strict_box_verify=False`` reads DAPO's ``Answer:`` line), with these
deliberate differences:

1. **One 300-character window.** verl keeps the last 300 characters, then ``is_correct_strict_box`` re-slices
   them to the last 100, so a correct box that starts 100–300 characters before the end scores −1. Here the answer
   is the last complete box of the whole response (:func:`stapo_verl.rewards.extract.final_box_answer`), accepted
   when it closes inside the last :data:`TAIL_CHARS` characters: a box followed by more than 300 characters is not
   the final answer (as in verl), and answers longer than the window are found. An unclosed last box (a truncated
   response) means no answer, as in verl. ``\\fbox{}`` and ``\\boxed x`` count as boxes, and a run of
   list-separated boxes is one list answer (see :mod:`stapo_verl.rewards.extract`).
2. **Normalised comparison, confirmed by math-verify** (:func:`answers_match_strict`). Equal after verl's two
   normalisers (``math_dapo.normalize_final_answer`` then ``math_reward.strip_string``:
   ``\\dfrac{1}{2}`` = ``\\tfrac12`` = ``\\frac{1}{2}``, ``20\\%`` = ``20``, ``34^\\circ`` = ``34``, ``1,000`` = ``1000``)
   is necessary but not sufficient: those normalisers keep only what follows the last ``=`` and glue ``1,2`` into
   ``12``, so the match must also hold for :func:`stapo_verl.rewards.equivalence.answers_equivalent` (math-verify,
   exact numbers). Plain numbers (``5.0`` = ``05`` = ``5``) are compared exactly without math-verify. Nothing else is
   equal: ``\\frac{10}{2}`` is not ``5`` (math-verify would accept it); ``normalize=False`` is JustRL's raw match.
3. **DAPO's answer line** (:func:`score_dapo_format`, the ``math_dapo`` route): verl's published rule
   (``math_dapo.verify``: the ``Answer:`` line in the last 300 characters first, the box only when there is no
   such line) with markdown emphasis removed (``**Answer:** 42``, ``Answer: **42**``).

Box contents longer than :data:`MAX_NORMALIZE_CHARS` are compared raw: verl's ``normalize_final_answer`` is
super-linear (one ``$`` then 16k characters: 3 s; 100k: minutes). Callers run these functions through
:class:`stapo_verl.rewards.timeout.KillableRunner` anyway.
"""

from __future__ import annotations

from stapo_verl.rewards.equivalence import EXACT, answers_equivalent, plain_number
from stapo_verl.rewards.extract import dapo_answer_line, final_box_answer
from stapo_verl.rewards.verl_rules import DAPO_TAIL_CHARS, normalize_final_answer, strip_string

__all__ = [
    "MAX_NORMALIZE_CHARS",
    "TAIL_CHARS",
    "answers_match_strict",
    "canonical_answer",
    "extract_boxed_answer",
    "extract_final_answer",
    "score_dapo_format",
    "score_strict_box",
]

#: Characters at the end of a response in which the final answer must lie (verl ``math_dapo.compute_score``).
TAIL_CHARS = DAPO_TAIL_CHARS
#: Longer answers are compared raw only (verl never normalises more than its 300-character window).
MAX_NORMALIZE_CHARS = 2000


def canonical_answer(answer: str) -> str:
    """``strip_string(normalize_final_answer(answer))``, verl's two normalisers chained.

    Examples: ``"\\dfrac{1}{2}"``, ``"\\tfrac12"`` and ``"\\frac{1}{2}"`` give ``"\\frac{1}{2}"``; ``"20\\%"`` gives
    ``"20"``. Where ``strip_string`` raises (two ``"\\text{ "``, a trailing ``\\sqrt``), the result of
    ``normalize_final_answer`` is returned, as verl's ``math_reward.is_equiv`` falls back to the raw strings.
    """
    normalized = normalize_final_answer(answer)
    try:
        return strip_string(normalized)
    except (AssertionError, IndexError):
        return normalized


def answers_match_strict(pred: str, ground_truth: str, normalize: bool = True) -> tuple[bool, str]:
    """Strict equality of an extracted answer and the ground truth (module docstring, point 2).

    Args:
        pred: the extracted answer (box content or ``Answer:`` line).
        ground_truth: the reference answer.
        normalize: False = raw exact match only (JustRL).

    Returns:
        ``(correct, pred_shown)``; ``pred_shown`` is the canonical form of ``pred`` (raw when not normalised).
    """
    if pred == ground_truth:
        return True, pred
    if not normalize or len(pred) > MAX_NORMALIZE_CHARS:
        return False, pred
    canon = canonical_answer(pred)
    a, b = plain_number(pred), plain_number(ground_truth)
    if a is not None and b is not None:
        return a == b, canon
    if canon != canonical_answer(ground_truth):
        return False, canon
    return answers_equivalent(pred, ground_truth, EXACT), canon


def extract_boxed_answer(text: str, tail_chars: int | None = TAIL_CHARS) -> str | None:
    """The final boxed answer of ``text`` if it closes within the last ``tail_chars`` characters.

    Same as :func:`stapo_verl.rewards.extract.final_box_answer` (kept under this name for callers).

    Args:
        text: the model response.
        tail_chars: the window; ``None`` = anywhere.

    Returns:
        The box content (a run of list-separated boxes joined with ``", "``) or None.
    """
    return final_box_answer(text, tail_chars)


def extract_final_answer(text: str, tail_chars: int = TAIL_CHARS) -> str | None:
    """The final answer in DAPO's format: the ``Answer:`` line if there is one in the tail, else the final box.

    verl's ``math_dapo.verify`` order ("Prefer Minerva (``Answer: ...``); fall back to ``\\boxed{}``"), with markdown
    emphasis removed from the line (:func:`stapo_verl.rewards.extract.dapo_answer_line`) and the box found as in
    :func:`extract_boxed_answer`.

    Returns:
        The answer text or None.
    """
    line = dapo_answer_line(text, tail_chars)
    if line is not None:
        return line
    return final_box_answer(text, tail_chars)


def _result(answer: str | None, ground_truth: str, normalize: bool) -> dict:
    if answer is None:
        return {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    correct, pred = answers_match_strict(answer, ground_truth, normalize)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred, "timeout": False, "no_box": False}


def score_strict_box(solution_str: str, ground_truth: str, tail_chars: int = TAIL_CHARS,
                     normalize: bool = True) -> dict:
    """Score one response with the strict-box rule (±1): the final box, closed in the tail, strictly equal.

    Args:
        solution_str: decoded response text.
        ground_truth: the reference answer (DAPO-Math-17k: an integer as a string).
        tail_chars: see :func:`extract_boxed_answer`.
        normalize: :func:`answers_match_strict` (True) or raw exact match only (False).

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str, "timeout": False, "no_box": bool}``; ``pred`` is the
        canonical box content ("" when there is no box).
    """
    return _result(extract_boxed_answer(solution_str, tail_chars), ground_truth, normalize)


def score_dapo_format(solution_str: str, ground_truth: str, tail_chars: int = TAIL_CHARS,
                      normalize: bool = True) -> dict:
    """Score one response in DAPO's format (``Answer:`` line, else box), ±1.

    Same as :func:`score_strict_box` except that the answer is :func:`extract_final_answer`; ``no_box`` is True
    when neither an ``Answer:`` line nor a box is found.
    """
    return _result(extract_final_answer(solution_str, tail_chars), ground_truth, normalize)
