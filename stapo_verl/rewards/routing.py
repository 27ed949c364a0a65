"""Route verl ``data_source`` values to a scorer and run it under a hard timeout.

Routing (keys are matched case-insensitively):

* DAPO-format scorer (:func:`.dapo.score_dapo_format`, training reward; spec §6.1, A15): ``math_dapo`` (what
  ``python -m stapo_verl.data.prepare --dataset dapo-math-17k`` writes, and the name the *published*
  DAPO-Math-17k parquet carries) and ``math_dapo_reasoning``. The final answer is the last ``\\boxed{}`` or the
  last ``Answer:`` line, whichever comes last in the 300-character tail: the published prompt asks for
  ``Answer: $Answer``, JustRL's (prepare's) for ``\\boxed{}``, and the reward never sees the prompt. verl's own
  ``math_dapo`` scorer accepts both forms too.
* strict box scorer (:func:`.dapo.score_strict_box`): ``dapo-math-17k``, ``dapo-17k`` (the SvS copy, bare problem
  texts); ``scorer="strict_box"`` forces it everywhere (JustRL's box-only rule).
* math-verify scorer (:mod:`.math_verify_scorer`, evaluation; spec §6.2, A16): ``aime24``, ``aime25``,
  ``amc23``, ``math500``, ``minerva``, ``olympiadbench``, ``gsm8k``, any other ``aime*``, verl's own names
  ``huggingfaceh4/math-500``, ``openai/gsm8k``, ``lighteval/math``, ``digitallearninggmbh/math-lighteval``, and
  ``math``: Hendrycks MATH answers are LaTeX expressions (``\\frac{\\sqrt{3}}{2}``, intervals, tuples), for which an
  exact string match after normalisation rejects correct equivalent forms; the strict scorers are for DAPO's
  integer answers. (verl 0.9.1's ``default_compute_score`` sends ``math`` to its DAPO scorer; here it gets the
  benchmark scorer.)

Anything else raises :class:`UnknownDataSourceError` (verl's ``default_compute_score`` raises
``NotImplementedError`` likewise) rather than silently scoring with the wrong rule.
"""

from __future__ import annotations

import logging
import os
import threading

from stapo_verl.rewards.dapo import score_dapo_format, score_strict_box
from stapo_verl.rewards.math_verify_scorer import score_math_verify
from stapo_verl.rewards.timeout import DEFAULT_TIMEOUT_S, KillableRunner

logger = logging.getLogger(__name__)

STRICT_BOX = "strict_box"
DAPO_FORMAT = "dapo_format"
MATH_VERIFY = "math_verify"
SCORERS = {STRICT_BOX: score_strict_box, DAPO_FORMAT: score_dapo_format, MATH_VERIFY: score_math_verify}

_ROUTES = {
    "math_dapo": DAPO_FORMAT,
    "math_dapo_reasoning": DAPO_FORMAT,
    "dapo-math-17k": STRICT_BOX,
    "dapo-17k": STRICT_BOX,
    "math": MATH_VERIFY,
    "aime24": MATH_VERIFY,
    "aime25": MATH_VERIFY,
    "amc23": MATH_VERIFY,
    "math500": MATH_VERIFY,
    "minerva": MATH_VERIFY,
    "olympiadbench": MATH_VERIFY,
    "gsm8k": MATH_VERIFY,
    "huggingfaceh4/math-500": MATH_VERIFY,
    "openai/gsm8k": MATH_VERIFY,
    "lighteval/math": MATH_VERIFY,
    "digitallearninggmbh/math-lighteval": MATH_VERIFY,
}


class UnknownDataSourceError(ValueError):
    """A ``data_source`` (or forced scorer name) that no scorer is registered for."""


def scorer_for(data_source: str) -> str:
    """Name of the scorer (``"dapo_format"``, ``"strict_box"`` or ``"math_verify"``) for a ``data_source``.

    Raises:
        UnknownDataSourceError: naming the value and the allowed ones.
    """
    key = str(data_source).strip().lower()
    if key in _ROUTES:
        return _ROUTES[key]
    if key.startswith("aime"):
        return MATH_VERIFY
    raise UnknownDataSourceError(
        f"data_source={data_source!r} has no scorer; allowed: {sorted(_ROUTES)} or any 'aime*' "
        f"(or pass scorer= one of {sorted(SCORERS)} in reward.custom_reward_function.reward_kwargs)"
    )


_runner: KillableRunner | None = None
_runner_lock = threading.Lock()


def get_runner() -> KillableRunner:
    """The process-wide :class:`KillableRunner` (created on first use; env ``STAPO_REWARD_TIMEOUT_S``)."""
    global _runner
    if _runner is None:
        with _runner_lock:
            if _runner is None:
                _runner = KillableRunner(timeout_s=float(os.environ.get("STAPO_REWARD_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
    return _runner


def timeout_result(solution_str: str) -> dict:
    """The result recorded for a timed-out scorer call: wrong (−1), ``timeout=True``, ``pred=""``."""
    return {"score": -1.0, "acc": False, "pred": "", "timeout": True, "no_box": "\\boxed{" not in solution_str}


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict | None = None,
    *,
    scorer: str | None = None,
    timeout_s: float | None = None,
    **kwargs,
) -> dict:
    """verl custom reward function: score one response with the scorer routed from ``data_source``.

    Signature follows verl 0.9.1's reward-loop managers (``experimental/reward_loop/reward_manager/naive.py``,
    ``dapo.py``: ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **extra)``), loaded by
    ``trainer/ppo/reward.py:get_custom_reward_fn`` from ``pkg://stapo_verl.rewards`` / ``compute_score``;
    ``reward.custom_reward_function.reward_kwargs`` arrive as keyword arguments.

    Args:
        data_source: the row's ``data_source`` (see the module docstring for the routing).
        solution_str: decoded response.
        ground_truth: ``reward_model.ground_truth`` (non-str values are converted with ``str``).
        extra_info: the row's ``extra_info`` (unused; accepted for verl).
        scorer: force ``"strict_box"``, ``"dapo_format"`` or ``"math_verify"`` for every data source.
        timeout_s: hard per-sample timeout in seconds (default env ``STAPO_REWARD_TIMEOUT_S`` or 5);
            ``0`` runs the scorer in-process without protection (debugging only).
        **kwargs: other verl keywords (``reward_router_address``, ...) are ignored.

    Returns:
        ``{"score": float ±1, "acc": bool, "pred": str, "timeout": bool, "no_box": bool, "data_source": str}`` — the same keys
        for every call, because verl builds its reward-extra arrays from the first sample's keys.

    Raises:
        UnknownDataSourceError: unknown ``data_source`` or ``scorer``.
    """
    name = scorer if scorer is not None else scorer_for(data_source)
    if name not in SCORERS:
        raise UnknownDataSourceError(f"scorer={name!r} is unknown; allowed: {sorted(SCORERS)}")
    fn = SCORERS[name]
    solution_str = str(solution_str)
    ground_truth = str(ground_truth)
    if timeout_s is not None and float(timeout_s) == 0:
        out = fn(solution_str, ground_truth)
    else:
        result = get_runner().run(fn, solution_str, ground_truth, timeout_s=timeout_s)
        if result.timed_out:
            out = timeout_result(solution_str)
        elif result.error is not None:  # the scorer raised (or its worker died): a wrong answer, not a timeout
            logger.warning("reward scorer %s failed on data_source=%r: %s", name, data_source, result.error)
            out = timeout_result(solution_str)
            out["timeout"] = False
        else:
            out = result.value
    # verl's validation dump (trainer.validation_data_dir) records reward-extra keys per row; the source lets
    # stapo_verl.plots compute a per-benchmark standard error. verl skips string values in its metrics.
    return {**out, "data_source": str(data_source)}
