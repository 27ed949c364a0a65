"""Route verl ``data_source`` values to a scorer and a numeric tolerance, and run it under a hard timeout.

Routing (keys matched case-insensitively; :func:`route_for`):

* **DAPO format** (:func:`stapo_verl.rewards.dapo.score_dapo_format`, training reward), tolerance exact:
  ``math_dapo`` (what ``python -m stapo_verl.data.prepare --dataset dapo-math-17k`` writes, and the name the
  published DAPO-Math-17k parquet carries) and ``math_dapo_reasoning``. The published prompt asks for
  ``Answer: $Answer``, JustRL's (prepare's) for ``\\boxed{}``, and the reward never sees the prompt: both are read,
  with verl's order (the ``Answer:`` line first).
* **strict box** (:func:`stapo_verl.rewards.dapo.score_strict_box`), tolerance exact: ``dapo-math-17k`` and
  ``dapo-17k`` (the SvS copy, bare problem texts); ``scorer="strict_box"`` forces it everywhere (JustRL's rule).
* **math-verify** (:func:`stapo_verl.rewards.math_verify_scorer.score_math_verify`, evaluation):
  ``aime24``, ``aime25``, any other ``aime*``, ``amc23``, ``math500``, ``olympiadbench``, ``gsm8k``, ``math`` and
  verl's names ``huggingfaceh4/math-500``, ``openai/gsm8k``, ``lighteval/math``,
  ``digitallearninggmbh/math-lighteval`` with tolerance exact (competition answers are exact numbers and
  expressions); ``minerva`` with relative tolerance 1e-4 (physical quantities given to a few significant figures;
  see :mod:`stapo_verl.rewards.equivalence`). Hendrycks MATH answers are LaTeX expressions (``\\frac{\\sqrt{3}}{2}``,
  intervals, tuples), for which a string match after normalisation rejects correct equivalent forms; verl 0.9.1's
  ``default_compute_score`` sends ``math`` to its DAPO scorer, here it gets the benchmark scorer.

Anything else raises :class:`UnknownDataSourceError` (verl's ``default_compute_score`` raises
``NotImplementedError`` likewise) rather than silently scoring with the wrong rule.

The killable worker processes (:class:`~stapo_verl.rewards.timeout.KillableRunner`) belong to whoever scores:
:func:`compute_score` takes the runner as an argument, and :class:`RewardFunction` (what verl loads as
``stapo_verl.rewards.compute_score``) creates one on its first call and keeps it for its lifetime, so the runner
lives as long as the verl reward manager that holds the function.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from types import MappingProxyType

from stapo_verl.rewards.dapo import score_dapo_format, score_strict_box
from stapo_verl.rewards.equivalence import EXACT, RELATIVE_1E4, TOLERANCES, get_tolerance
from stapo_verl.rewards.ground_truth import GroundTruthError, ground_truth_problem
from stapo_verl.rewards.math_verify_scorer import score_math_verify
from stapo_verl.rewards.timeout import DEFAULT_TIMEOUT_S, KillableRunner

logger = logging.getLogger(__name__)

STRICT_BOX = "strict_box"
DAPO_FORMAT = "dapo_format"
MATH_VERIFY = "math_verify"
SCORERS = (STRICT_BOX, DAPO_FORMAT, MATH_VERIFY)
#: Keys of every :func:`compute_score` result (verl builds its reward-extra arrays from the first sample's keys).
RESULT_KEYS = ("score", "acc", "pred", "timeout", "no_box", "data_source", "ground_truth_error")


@dataclasses.dataclass(frozen=True)
class Route:
    """A scorer name (one of :data:`SCORERS`) and a tolerance name (a key of ``equivalence.TOLERANCES``)."""

    scorer: str
    tolerance: str


_ROUTES = MappingProxyType({
    "math_dapo": Route(DAPO_FORMAT, EXACT.name),
    "math_dapo_reasoning": Route(DAPO_FORMAT, EXACT.name),
    "dapo-math-17k": Route(STRICT_BOX, EXACT.name),
    "dapo-17k": Route(STRICT_BOX, EXACT.name),
    "math": Route(MATH_VERIFY, EXACT.name),
    "aime24": Route(MATH_VERIFY, EXACT.name),
    "aime25": Route(MATH_VERIFY, EXACT.name),
    "amc23": Route(MATH_VERIFY, EXACT.name),
    "math500": Route(MATH_VERIFY, EXACT.name),
    "minerva": Route(MATH_VERIFY, RELATIVE_1E4.name),
    "olympiadbench": Route(MATH_VERIFY, EXACT.name),
    "gsm8k": Route(MATH_VERIFY, EXACT.name),
    "huggingfaceh4/math-500": Route(MATH_VERIFY, EXACT.name),
    "openai/gsm8k": Route(MATH_VERIFY, EXACT.name),
    "lighteval/math": Route(MATH_VERIFY, EXACT.name),
    "digitallearninggmbh/math-lighteval": Route(MATH_VERIFY, EXACT.name),
})


class UnknownDataSourceError(ValueError):
    """A ``data_source`` (or forced scorer / tolerance name) that nothing is registered for."""


def route_for(data_source: str) -> Route:
    """The :class:`Route` of a ``data_source``.

    Raises:
        UnknownDataSourceError: naming the value and the allowed ones.
    """
    key = str(data_source).strip().lower()
    if key in _ROUTES:
        return _ROUTES[key]
    if key.startswith("aime"):
        return Route(MATH_VERIFY, EXACT.name)
    raise UnknownDataSourceError(
        f"data_source={data_source!r} has no scorer; allowed: {sorted(_ROUTES)} or any 'aime*' "
        f"(or pass scorer= one of {sorted(SCORERS)} in reward.custom_reward_function.reward_kwargs)")


def scorer_for(data_source: str) -> str:
    """Name of the scorer (``"dapo_format"``, ``"strict_box"`` or ``"math_verify"``) for a ``data_source``.

    Raises:
        UnknownDataSourceError: naming the value and the allowed ones.
    """
    return route_for(data_source).scorer


def score_response(scorer: str, tolerance: str, solution_str: str, ground_truth: str) -> dict:
    """Score one response in this process (what a worker runs): the named scorer with the named tolerance.

    Raises:
        UnknownDataSourceError: unknown ``scorer`` or ``tolerance``.
    """
    if scorer == MATH_VERIFY:
        try:
            tol = get_tolerance(tolerance)
        except ValueError as exc:
            raise UnknownDataSourceError(str(exc)) from None
        return score_math_verify(solution_str, ground_truth, tol)
    if tolerance != EXACT.name:
        raise UnknownDataSourceError(f"scorer={scorer!r} compares exactly; tolerance={tolerance!r} is not allowed")
    if scorer == STRICT_BOX:
        return score_strict_box(solution_str, ground_truth)
    if scorer == DAPO_FORMAT:
        return score_dapo_format(solution_str, ground_truth)
    raise UnknownDataSourceError(f"scorer={scorer!r} is unknown; allowed: {sorted(SCORERS)}")


def runner_from_env() -> KillableRunner:
    """A new :class:`KillableRunner` with the timeout of env ``STAPO_REWARD_TIMEOUT_S`` (default
    :data:`~stapo_verl.rewards.timeout.DEFAULT_TIMEOUT_S`); no process starts before its first call.

    Raises:
        ValueError: ``STAPO_REWARD_TIMEOUT_S`` is not a positive number.
    """
    raw = os.environ.get("STAPO_REWARD_TIMEOUT_S", str(DEFAULT_TIMEOUT_S))
    try:
        timeout = float(raw)
    except ValueError as exc:
        raise ValueError(f"STAPO_REWARD_TIMEOUT_S={raw!r} must be a number of seconds") from exc
    return KillableRunner(timeout_s=timeout)


def _has_box(text: str) -> bool:
    return "\\boxed" in text or "\\fbox" in text


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None, *,
                  runner: KillableRunner | None = None, scorer: str | None = None, tolerance: str | None = None,
                  timeout_s: float | None = None, **kwargs) -> dict:
    """Score one response with the scorer routed from ``data_source``, in ``runner``'s killable workers.

    What verl calls is :class:`RewardFunction`, which passes its own runner. The signature is the one verl 0.9.1's
    reward-loop managers call (``verl.experimental.reward_loop.reward_manager.naive.NaiveRewardManager.run_single``
    and ``...dapo.DAPORewardManager.run_single``: ``compute_score(data_source=, solution_str=, ground_truth=,
    extra_info=, **extra)``); verl loads it with ``verl.trainer.ppo.reward.get_custom_reward_fn`` from
    ``reward.custom_reward_function.path=pkg://stapo_verl.rewards`` and ``name=compute_score``, and passes
    ``reward.custom_reward_function.reward_kwargs`` as keyword arguments.

    Args:
        data_source: the row's ``data_source`` (routing: module docstring).
        solution_str: decoded response.
        ground_truth: ``reward_model.ground_truth`` (non-str values are converted with ``str``).
        extra_info: the row's ``extra_info`` (unused; accepted for verl).
        runner: the killable workers to score in (required unless ``timeout_s=0``).
        scorer: force ``"strict_box"``, ``"dapo_format"`` or ``"math_verify"`` for every data source.
        tolerance: force a tolerance of the math-verify scorer (``"exact"`` or ``"relative_1e-4"``).
        timeout_s: hard per-sample timeout in seconds (default: the runner's; for :class:`RewardFunction`'s, env
            ``STAPO_REWARD_TIMEOUT_S`` or 5); ``0`` runs the scorer in this process without protection (debugging
            and tests only).
        **kwargs: other verl keywords (``reward_router_address``, ...) are ignored.

    Returns:
        ``{"score": ±1.0, "acc": bool, "pred": str, "timeout": bool, "no_box": bool, "data_source": str,
        "ground_truth_error": False}``, the same keys (:data:`RESULT_KEYS`) for every call.

    Raises:
        stapo_verl.rewards.ground_truth.GroundTruthError: ``ground_truth`` is missing, empty or of a type no scorer
            compares (:func:`stapo_verl.rewards.ground_truth.ground_truth_problem`), instead of scoring −1.
        UnknownDataSourceError: unknown ``data_source``, ``scorer`` or ``tolerance``.
        ValueError: negative ``timeout_s``, or no ``runner`` with a ``timeout_s`` other than 0.
        stapo_verl.rewards.timeout.WorkerStartError: the reward workers cannot start (e.g. math-verify missing, or
            it differs from what the reward code's ledger was written for).
        stapo_verl.rewards.ledger.IncompatibleRewardSiteError: the pool's Python or pebble sites differ from what the
            ledger was written for (:mod:`stapo_verl.rewards.ledger`).
    """
    route = route_for(data_source) if scorer is None else Route(
        scorer, route_for(data_source).tolerance if str(data_source).strip().lower() in _ROUTES else EXACT.name)
    if route.scorer not in SCORERS:
        raise UnknownDataSourceError(f"scorer={route.scorer!r} is unknown; allowed: {sorted(SCORERS)}")
    if tolerance is not None:
        if tolerance not in TOLERANCES:
            raise UnknownDataSourceError(f"tolerance={tolerance!r} is unknown; allowed: {sorted(TOLERANCES)}")
        route = Route(route.scorer, tolerance)
    if route.scorer != MATH_VERIFY and route.tolerance != EXACT.name:
        raise UnknownDataSourceError(
            f"scorer={route.scorer!r} compares exactly; tolerance={route.tolerance!r} is only for 'math_verify'")
    problem = ground_truth_problem(ground_truth)
    if problem is not None:
        raise GroundTruthError(data_source, ground_truth, problem)
    solution_str, ground_truth = str(solution_str), str(ground_truth)
    if timeout_s is not None and float(timeout_s) < 0:
        raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
    if timeout_s is not None and float(timeout_s) == 0:
        out = score_response(route.scorer, route.tolerance, solution_str, ground_truth)
    else:
        if runner is None:
            raise ValueError(f"compute_score(timeout_s={timeout_s!r}) needs a runner (a KillableRunner the caller "
                             "owns; stapo_verl.rewards.compute_score brings its own), or timeout_s=0")
        result = runner.run(score_response, route.scorer, route.tolerance, solution_str, ground_truth,
                            timeout_s=timeout_s)
        if result.timed_out:
            out = {"score": -1.0, "acc": False, "pred": "", "timeout": True, "no_box": not _has_box(solution_str)}
        elif result.error is not None:  # the scorer raised on this input (or its worker died): a wrong answer
            logger.warning("reward scorer %s failed on data_source=%r: %s", route.scorer, data_source, result.error)
            out = {"score": -1.0, "acc": False, "pred": "", "timeout": False, "no_box": not _has_box(solution_str)}
        else:
            out = result.value
    # verl's validation dump records reward-extra keys per row; the source lets stapo_verl.plots compute a
    # per-benchmark standard error. verl skips string values in its metrics.
    return {**out, "data_source": str(data_source), "ground_truth_error": False}


def ground_truth_error_result(data_source) -> dict:
    """What :class:`RewardFunction` returns for a row :func:`compute_score` refused with :class:`GroundTruthError`:
    score 0 (neither right nor wrong: in a GRPO group, every response of the row scores 0, so its advantages are 0
    and it moves nothing) and ``ground_truth_error=True``, which verl's validation reports as
    ``val-aux/<data_source>/ground_truth_error/mean@1``."""
    return {"score": 0.0, "acc": False, "pred": "", "timeout": False, "no_box": False, "data_source": str(data_source),
            "ground_truth_error": True}


class RewardFunction:
    """verl's custom reward function with the killable workers it scores in: ``stapo_verl.rewards.compute_score``.

    Each lookup of ``stapo_verl.rewards.compute_score`` returns a new one (the package's ``__getattr__``): verl
    loads the function once per reward manager (``verl.utils.import_utils.load_extern_object`` in
    ``verl.trainer.ppo.reward.get_custom_reward_fn``) and holds it, so the workers belong to that manager. The
    runner (:func:`runner_from_env`) is created on the first call that needs it (not for ``timeout_s=0``); calls
    may come from many threads (verl's executor). A copy (pickle) starts without workers.

    Args:
        runner: the workers to score in; default: :func:`runner_from_env` on first use.
    """

    def __init__(self, runner: KillableRunner | None = None) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._warned = False

    @property
    def runner(self) -> KillableRunner:
        """The :class:`KillableRunner` of this function (created on first use).

        Raises:
            ValueError: ``STAPO_REWARD_TIMEOUT_S`` is not a positive number.
        """
        with self._lock:
            if self._runner is None:
                self._runner = runner_from_env()
            return self._runner

    def __call__(self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                 **kwargs) -> dict:
        """:func:`compute_score` with this function's runner (same arguments, results and errors), except for a
        :class:`~stapo_verl.rewards.ground_truth.GroundTruthError`: that row gets :func:`ground_truth_error_result`
        (an error metric, not a wrong answer) and the first one is logged once."""
        timeout_s = kwargs.get("timeout_s")
        in_process = timeout_s is not None and float(timeout_s) == 0
        try:
            return compute_score(data_source, solution_str, ground_truth, extra_info,
                                 runner=None if in_process else self.runner, **kwargs)
        except GroundTruthError as exc:
            with self._lock:
                first, self._warned = not self._warned, True
            if first:
                logger.warning("%s; such rows score 0 with ground_truth_error=True (logged once)", exc)
            return ground_truth_error_result(data_source)

    def close(self) -> None:
        """Stop the workers (idempotent; a later call starts new ones)."""
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()

    def __enter__(self) -> RewardFunction:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
