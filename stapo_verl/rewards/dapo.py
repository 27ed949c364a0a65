"""DAPO / JustRL strict ``\\boxed{}`` scorer with ±1 rewards, without verl's 100-character window bug (D13).

Follows ``verl/utils/reward_score/math_dapo.py`` (``compute_score(..., strict_box_verify=True)``, the reward JustRL
and STAPO train with; spec §6.1, §9.3, A15), with two deliberate differences:

1. **One window (fixes bug D13).** verl keeps the last 300 characters and then ``is_correct_strict_box``
   re-slices them to the last 100, so a correct box whose ``\\boxed{`` starts more than 100 characters before the
   end scores −1. Here the answer is the **last complete** ``\\boxed{...}`` of the *whole* response (brace
   matched), and it is accepted when its closing brace lies inside the last :data:`TAIL_CHARS` (300) characters.
   This keeps the "answer at the end" semantics of the 300-character window (a box followed by more than 300
   characters of text is ignored, as in verl), and it also finds answers longer than the window, whose
   ``\\boxed{`` starts before it (verl cannot see those at all). An unclosed last ``\\boxed{`` (a truncated
   response) means "no answer", exactly as in verl.
2. **Normalised comparison.** Prediction and ground truth are both passed through verl's
   ``math_dapo.normalize_final_answer`` (called, not copied) before the exact string comparison; an exact raw
   match is accepted first. ``normalize=False`` gives JustRL's pure exact match. Contents longer than
   :data:`MAX_NORMALIZE_CHARS` are compared raw (verl never normalises more than 300 characters).

These functions can be slow on adversarial input (D12: ``normalize_final_answer``'s regexes); callers run them
through :mod:`stapo_verl.rewards.timeout`.
"""

from __future__ import annotations

import importlib.util
import os

#: Characters at the end of a response in which the final box must close (verl ``math_dapo.py:267``).
TAIL_CHARS = 300
#: Longer box contents are compared raw only. verl never normalises more than its 300-character window, and
#: ``normalize_final_answer`` is super-linear on long inputs (one ``$`` + 16k characters: 3 s; 100k: minutes, D12).
MAX_NORMALIZE_CHARS = 2000
BOX_OPEN = "\\boxed{"

_MATH_DAPO = None


def _load_verl_math_dapo():
    """Load ``verl/utils/reward_score/math_dapo.py`` without executing ``verl/__init__.py``.

    Importing the ``verl`` package pulls in torch and the plugin entry points (~6 s on a loaded CPU), which
    would make every reward worker start slow. ``math_dapo.py`` itself only imports ``re`` and ``typing``, so it
    is loaded straight from the installed verl wheel. Falls back to a normal import if the file is not found.
    """
    spec = importlib.util.find_spec("verl")
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "reward_score", "math_dapo.py")
        if os.path.exists(path):
            file_spec = importlib.util.spec_from_file_location("_stapo_verl_math_dapo", path)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return module
    from verl.utils.reward_score import math_dapo  # pragma: no cover - unusual installs only

    return math_dapo


def _verl_math_dapo():
    global _MATH_DAPO
    if _MATH_DAPO is None:
        _MATH_DAPO = _load_verl_math_dapo()
    return _MATH_DAPO


def normalize_final_answer(answer: str) -> str:
    """verl's ``math_dapo.normalize_final_answer`` (lazily loaded; see :func:`_load_verl_math_dapo`).

    Args:
        answer: a final-answer string, e.g. the content of a ``\\boxed{}``.

    Returns:
        The normalised string (units/``\\text``/``$`` removed, ``\\fracab`` expanded, ``1,000`` → ``1000``).
    """
    return _verl_math_dapo().normalize_final_answer(answer)


def find_last_boxed(text: str) -> tuple[int, int] | None:
    """Locate the last ``\\boxed{...}`` of ``text`` by brace matching.

    Args:
        text: any string.

    Returns:
        ``(start, end)`` with ``text[start:end] == "\\boxed{...}"`` (``end`` exclusive), or ``None`` when there is
        no ``\\boxed{`` or the last one is never closed. verl's ``math_dapo.last_boxed_only_string`` does the
        brace matching (linear in ``len(text) - start``; escaped braces count as braces).
    """
    boxed = _verl_math_dapo().last_boxed_only_string(text)  # brace matching from the last "\\boxed{"
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


def score_strict_box(
    solution_str: str, ground_truth: str, tail_chars: int = TAIL_CHARS, normalize: bool = True
) -> dict:
    """Score one response with the strict-box rule (±1).

    Args:
        solution_str: decoded response text.
        ground_truth: the reference answer (DAPO-Math-17k: an integer as a string).
        tail_chars: see :func:`extract_boxed_answer`.
        normalize: compare after verl's ``normalize_final_answer`` (True) or raw exact match only (False);
            box contents longer than :data:`MAX_NORMALIZE_CHARS` are always compared raw.

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str, "timeout": False, "no_box": bool}``; ``pred`` is the
        normalised box content ("" when there is no box).
    """
    boxed = extract_boxed_answer(solution_str, tail_chars)
    if boxed is None:
        return {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    gt = str(ground_truth)
    if boxed == gt:
        correct, pred = True, boxed
    elif normalize and len(boxed) <= MAX_NORMALIZE_CHARS:
        pred = normalize_final_answer(boxed)
        correct = pred == normalize_final_answer(gt)
    else:
        correct, pred = False, boxed
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred, "timeout": False, "no_box": False}
