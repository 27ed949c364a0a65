"""DAPO / JustRL strict final-answer scorers with ±1 rewards, without verl's 100-character window bug (D13).

Follows ``verl/utils/reward_score/math_dapo.py`` (``compute_score(..., strict_box_verify=True)``, the reward JustRL
and STAPO train with; spec §6.1, §9.3, A15), with these deliberate differences:

1. **One window (fixes bug D13).** verl keeps the last 300 characters and then ``is_correct_strict_box``
   re-slices them to the last 100, so a correct box whose ``\\boxed{`` starts more than 100 characters before the
   end scores −1. Here the answer is the **last complete** ``\\boxed{...}`` of the *whole* response (brace
   matched), and it is accepted when its closing brace lies inside the last :data:`TAIL_CHARS` (300) characters.
   This keeps the "answer at the end" semantics of the 300-character window (a box followed by more than 300
   characters of text is ignored, as in verl), and it also finds answers longer than the window, whose
   ``\\boxed{`` starts before it (verl cannot see those at all). An unclosed last ``\\boxed{`` (a truncated
   response) means "no answer", exactly as in verl.
2. **Normalised comparison** (:func:`answers_match_strict`). After an exact raw match, prediction and ground truth
   are compared after verl's two normalisers, ``math_dapo.normalize_final_answer`` then ``math_reward.strip_string``
   (:func:`stapo_verl.rewards.normalize.canonical_answer`: ``\\dfrac``/``\\tfrac`` = ``\\frac``, ``20\\%`` = ``20``),
   and as plain decimal numbers (``5.0`` = ``05`` = ``5``). ``strip_string`` also writes ``0.5`` and ``1/2`` as
   ``\\frac{1}{2}``. Nothing else is equivalent: ``\\frac{2}{4}`` is not ``\\frac{1}{2}`` and ``\\frac{10}{2}`` is not ``5``
   (math-verify would accept both). ``normalize=False`` gives JustRL's pure exact match. Contents
   longer than :data:`MAX_NORMALIZE_CHARS` are compared raw (verl never normalises more than 300 characters).
3. **DAPO's published answer line** (:func:`score_dapo_format`, the ``math_dapo`` route). The published
   DAPO-Math-17k prompt asks for a last line ``Answer: $Answer``; JustRL's (and ``stapo_verl.data.prepare``'s) asks
   for ``\\boxed{}``. The final answer is the later of the last complete box and the last ``Answer:`` line
   (verl's ``is_correct_minerva`` pattern), each only inside the same 300-character tail. verl's own non-strict
   ``math_dapo.verify`` accepts both forms too (``Answer:`` first, box as fallback).

These functions can be slow on adversarial input (D12: ``normalize_final_answer``'s regexes); callers run them
through :mod:`stapo_verl.rewards.timeout`.
"""

from __future__ import annotations

import re

from stapo_verl.rewards.normalize import (
    as_number,
    canonical_answer,
    load_verl_reward_module,
    normalize_final_answer,
)

#: Characters at the end of a response in which the final box must close (verl ``math_dapo.py:267``).
TAIL_CHARS = 300
#: Longer box contents are compared raw only. verl never normalises more than its 300-character window, and
#: ``normalize_final_answer`` is super-linear on long inputs (one ``$`` + 16k characters: 3 s; 100k: minutes, D12).
MAX_NORMALIZE_CHARS = 2000
BOX_OPEN = "\\boxed{"
#: DAPO's published answer line (its prompt: "The last line of your response should be of the form Answer: $Answer");
#: the default ``answer_pattern`` of verl's ``math_dapo.is_correct_minerva``.
DAPO_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

__all__ = [
    "BOX_OPEN",
    "DAPO_ANSWER_LINE",
    "MAX_NORMALIZE_CHARS",
    "TAIL_CHARS",
    "answers_match_strict",
    "extract_boxed_answer",
    "extract_final_answer",
    "find_last_boxed",
    "normalize_final_answer",
    "score_dapo_format",
    "score_strict_box",
]


def _load_verl_math_dapo():
    """verl's ``utils/reward_score/math_dapo.py`` module, loaded without ``import verl``."""
    return load_verl_reward_module("math_dapo")


def find_last_boxed(text: str) -> tuple[int, int] | None:
    """Locate the last ``\\boxed{...}`` of ``text`` by brace matching.

    Args:
        text: any string.

    Returns:
        ``(start, end)`` with ``text[start:end] == "\\boxed{...}"`` (``end`` exclusive), or ``None`` when there is
        no ``\\boxed{`` or the last one is never closed. verl's ``math_dapo.last_boxed_only_string`` does the
        brace matching (linear in ``len(text) - start``; escaped braces count as braces).
    """
    boxed = _load_verl_math_dapo().last_boxed_only_string(text)  # brace matching from the last "\\boxed{"
    if boxed is None:
        return None
    start = text.rfind(BOX_OPEN)
    return start, start + len(boxed)


def extract_boxed_answer(text: str, tail_chars: int | None = TAIL_CHARS) -> str | None:
    """Content of the last complete ``\\boxed{}`` of ``text``, if it closes within the last ``tail_chars``.

    Args:
        text: the model response.
        tail_chars: the window (characters at the end) in which the box must close; ``None`` = anywhere.

    Returns:
        The box content (may be empty) or ``None`` when there is no usable box.
    """
    span = find_last_boxed(text)
    if span is None:
        return None
    start, end = span
    if tail_chars is not None and end <= len(text) - tail_chars:  # closing brace before the window
        return None
    return text[start + len(BOX_OPEN) : end - 1]


def extract_final_answer(text: str, tail_chars: int = TAIL_CHARS) -> str | None:
    """The final answer of ``text`` in either DAPO form: the last ``\\boxed{}`` or the last ``Answer:`` line.

    The box must close inside the last ``tail_chars`` characters (:func:`extract_boxed_answer`); the ``Answer:``
    line must lie inside them, as in verl's ``math_dapo.compute_score`` (which searches ``solution_str[-300:]``).
    When both exist, the one that *starts* later is the final answer (``Answer: \\boxed{42}`` gives the box).

    Args:
        text: the model response.
        tail_chars: the window (characters at the end of ``text``).

    Returns:
        The answer text (the box content, or the rest of the ``Answer:`` line, stripped) or ``None``.
    """
    boxed = extract_boxed_answer(text, tail_chars)
    box_start = text.rfind(BOX_OPEN) if boxed is not None else -1
    offset = max(0, len(text) - tail_chars)
    line = None
    for line in DAPO_ANSWER_LINE.finditer(text, offset):
        pass
    if line is not None and line.start() > box_start:
        return line.group(1).strip()
    return boxed


def answers_match_strict(pred: str, ground_truth: str, normalize: bool = True) -> tuple[bool, str]:
    """Strict equality of a final answer and the ground truth (see the module docstring, point 2).

    Args:
        pred: the extracted answer (box content or ``Answer:`` line).
        ground_truth: the reference answer.
        normalize: False = raw exact match only (JustRL).

    Returns:
        ``(correct, pred_shown)``: ``pred_shown`` is the canonical form of ``pred`` (raw when not normalised).
    """
    if pred == ground_truth:
        return True, pred
    if not normalize or len(pred) > MAX_NORMALIZE_CHARS:
        return False, pred
    canon = canonical_answer(pred)
    if canon == canonical_answer(ground_truth):
        return True, canon
    a, b = as_number(pred), as_number(ground_truth)
    return (a is not None and a == b), canon


def _result(answer: str | None, ground_truth: str, normalize: bool) -> dict:
    if answer is None:
        return {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    correct, pred = answers_match_strict(answer, str(ground_truth), normalize)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred, "timeout": False, "no_box": False}


def score_strict_box(
    solution_str: str, ground_truth: str, tail_chars: int = TAIL_CHARS, normalize: bool = True
) -> dict:
    """Score one response with the strict-box rule (±1): the last box, closed in the tail, strictly equal.

    Args:
        solution_str: decoded response text.
        ground_truth: the reference answer (DAPO-Math-17k: an integer as a string).
        tail_chars: see :func:`extract_boxed_answer`.
        normalize: compare with :func:`answers_match_strict` (True) or raw exact match only (False).

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str, "timeout": False, "no_box": bool}``; ``pred`` is the
        normalised box content ("" when there is no box).
    """
    return _result(extract_boxed_answer(solution_str, tail_chars), ground_truth, normalize)


def score_dapo_format(
    solution_str: str, ground_truth: str, tail_chars: int = TAIL_CHARS, normalize: bool = True
) -> dict:
    """Score one response whose prompt may be DAPO's published one (``Answer: $Answer``) or JustRL's (box), ±1.

    Same as :func:`score_strict_box`, except that the final answer is :func:`extract_final_answer` (box or
    ``Answer:`` line, whichever comes last in the tail). ``no_box`` is True when neither form is found.
    """
    return _result(extract_final_answer(solution_str, tail_chars), ground_truth, normalize)
