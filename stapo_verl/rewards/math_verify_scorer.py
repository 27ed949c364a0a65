"""Benchmark scorer (AIME, AMC, MATH500, Minerva, OlympiadBench, GSM8K): the final box, compared by equivalence.

The prediction is the final boxed answer anywhere in the response (:func:`stapo_verl.rewards.extract.final_box_answer`:
``\\boxed{}``, ``\\fbox{}``, ``\\boxed x``; a run of list-separated boxes is one list answer, which is how a
multi-answer problem such as "find all primes ..." is answered with one box per value); a response without a box is
wrong. Prediction and gold are compared with :func:`stapo_verl.rewards.equivalence.answers_equivalent` under the
route's tolerance (exact, or relative 1e-4 for Minerva's physical quantities).
"""

from __future__ import annotations

from stapo_verl.rewards.equivalence import EXACT, Tolerance, answers_equivalent
from stapo_verl.rewards.extract import final_box_answer

__all__ = ["score_math_verify"]


def score_math_verify(solution_str: str, ground_truth: str, tolerance: Tolerance = EXACT) -> dict:
    """Score one response against a benchmark answer (±1).

    Args:
        solution_str: decoded response text.
        ground_truth: the gold answer (prepared parquet ``reward_model.ground_truth``).
        tolerance: numeric tolerance of the route (:mod:`stapo_verl.rewards.equivalence`).

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str, "timeout": False, "no_box": bool}``; ``pred`` is the raw
        final box content ("" when there is none).
    """
    boxed = final_box_answer(solution_str, tail_chars=None)
    if boxed is None:
        return {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": True}
    correct = answers_equivalent(boxed, ground_truth, tolerance)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": boxed, "timeout": False, "no_box": False}
