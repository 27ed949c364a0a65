"""Collapse early-warning: running z-scores of the policy entropy and of the gradient norms, and a console line.

Entropy collapse (the policy turns deterministic) and entropy blow-up are the failures STAPO claims to prevent; the
DGG paper (arXiv 2605.19425) reports the LM-head gradient norm as an early signal of the same collapse. Each signal
is compared with its own recent past: z_t = (x_t − mean(x_{t−w..t−1})) / sd(x_{t−w..t−1}) over the last w steps
(``policy_loss.collapse_window``), defined once ``collapse_warmup_steps`` earlier values exist. ``|z|`` above
``collapse_z_threshold`` prints one line saying what was seen and where the silenced tokens are; nothing else
happens (no automatic action).

======================================  ================================  =========================================
metric logged                           signal                            source
======================================  ================================  =========================================
``actor/stapo/collapse/entropy_z``      ``actor/entropy``                 verl's old-log-prob pass (every engine)
``actor/stapo/collapse/lm_head_grad_    ``actor/stapo/lm_head_grad_norm`` the plugin (FSDP engines; see
norm_z``                                                                  ``docs/diagnostics.md`` for Megatron)
``actor/stapo/collapse/grad_norm_z``    ``actor/grad_norm``               verl (every engine); warns only where the
                                                                          LM-head norm is not available
======================================  ================================  =========================================

The state (the windows) lives in a :class:`CollapseMonitor` on the trainer instance and is saved with every verl
checkpoint (:meth:`CollapseMonitor.state_dict`), so a resumed run scores exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from stapo_verl.algo.config_ranges import check_range
from stapo_verl.diagnostics.config import DIAGNOSTICS_RANGES, check_collapse_warmup


#: (signal metric, z metric, warns) in the order they are checked; the total grad norm warns only without the
#: LM-head norm (see :meth:`CollapseMonitor.observe`)
SIGNALS = (
    ("actor/entropy", "actor/stapo/collapse/entropy_z"),
    ("actor/stapo/lm_head_grad_norm", "actor/stapo/collapse/lm_head_grad_norm_z"),
    ("actor/grad_norm", "actor/stapo/collapse/grad_norm_z"),
)


@dataclass
class RunningZScore:
    """z of each new value against the previous ``window`` values.

    Attributes:
        window: how many previous values the mean and the standard deviation use (``policy_loss.collapse_window``).
        warmup: previous values needed before a z is returned (``policy_loss.collapse_warmup_steps``).
        log_scale: score ``log x`` against the logs of the history (the history keeps the values themselves); a
            value ≤ 0 is then not scored, like a non-finite one.

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError (a ValueError): ``window`` or ``warmup`` outside the config's
            ranges of those keys (window ≥ 2, 2 ≤ warmup ≤ window).
    """

    window: int
    warmup: int
    history: deque = field(default_factory=deque)
    log_scale: bool = False

    def __post_init__(self):
        check_range("collapse_window", self.window, DIAGNOSTICS_RANGES)
        check_collapse_warmup(self.warmup, self.window)
        self.history = deque(self.history, maxlen=self.window)

    def update(self, x: float) -> tuple[float | None, float, float, int]:
        """Score ``x`` against the history, then append it (non-finite values are neither scored nor kept).

        Returns:
            ``(z, mean, sd, n)``: mean and sample standard deviation of the n previous values the score used (of
            their logs with ``log_scale``); z is None during the warm-up or for a non-finite x. A flat history (sd = 0) gives z = 0 for the same value
            and ±inf for any other.
        """
        n = len(self.history)
        if not math.isfinite(x) or (self.log_scale and x <= 0):
            return None, math.nan, math.nan, n
        if n < self.warmup:
            self.history.append(x)
            return None, math.nan, math.nan, n
        past = [math.log(v) for v in self.history] if self.log_scale else list(self.history)
        y = math.log(x) if self.log_scale else x
        mean = statistics.fmean(past)
        sd = statistics.stdev(past)
        self.history.append(x)
        if sd > 0:
            return (y - mean) / sd, mean, sd, n
        return (0.0 if y == mean else math.copysign(math.inf, y - mean)), mean, sd, n


@dataclass
class CollapseMonitor:
    """The running z-scores of :data:`SIGNALS` for one run, and the warning lines.

    Attributes:
        window, warmup: of every :class:`RunningZScore`.
        threshold: |z| above which a warning line is returned; None: z-scores only, no warnings.
        log_scale: score the logs of the signals (default; module docstring), False: the values themselves.
    """

    window: int
    warmup: int
    threshold: float | None
    scores: dict = field(default_factory=dict)
    log_scale: bool = True

    def state_dict(self) -> dict[str, list[float]]:
        """The windows, ``{signal: [previous values, oldest first]}`` (JSON-serialisable), for a checkpoint."""
        return {signal: list(score.history) for signal, score in self.scores.items()}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        """Restore the windows saved by :meth:`state_dict` (a resumed run then scores as an uninterrupted one).

        Raises:
            ValueError: a signal not in :data:`SIGNALS`, or a non-finite value.
        """
        known = {signal for signal, _ in SIGNALS}
        scores = {}
        for signal, values in state.items():
            if signal not in known:
                raise ValueError(f"collapse monitor state: unknown signal {signal!r} (known: {sorted(known)})")
            if not all(math.isfinite(float(v)) for v in values):
                raise ValueError(f"collapse monitor state: non-finite value in {signal!r}: {values}")
            scores[signal] = RunningZScore(self.window, self.warmup, deque(float(v) for v in values), self.log_scale)
        self.scores = scores

    def observe(self, step: int, metrics: dict, *, where: str) -> tuple[dict[str, float], list[str]]:
        """Score this step's signals.

        Args:
            step: verl's global step. metrics: the step's metrics so far (signals missing from it are skipped).
            where: where the silenced tokens of this run can be read, appended to each warning.

        Returns:
            ``(z metrics, warning lines)``: a z metric for every signal present and past its warm-up; one line per
            signal whose |z| exceeds the threshold.
        """
        out, lines = {}, []
        for signal, z_key in SIGNALS:
            value = metrics.get(signal)
            if value is None:
                continue
            score = self.scores.setdefault(signal, RunningZScore(self.window, self.warmup, log_scale=self.log_scale))
            z, mean, sd, n = score.update(float(value))
            if z is None:
                continue
            out[z_key] = z
            warns = signal != "actor/grad_norm" or "actor/stapo/lm_head_grad_norm" not in metrics
            if warns and self.threshold is not None and abs(z) > self.threshold:
                lines.append(warning_line(step, signal, float(value), z, mean, sd, n, self.threshold,
                                          where, self.log_scale))
        return out, lines


def warning_line(step: int, signal: str, value: float, z: float, mean: float, sd: float, n: int, threshold: float,
                 where: str, log_scale: bool = False) -> str:
    """The one console line of a warning: what was seen, against what, and where the silenced tokens are
    (``log_scale``: ``mean`` and ``sd`` are of the logs; the line gives the geometric mean and the sd as a factor)."""
    direction = "above" if z > 0 else "below"
    if log_scale:
        against = (f"its running geometric mean {math.exp(mean):.4g} (sd a factor {math.exp(sd):.3g} on the log "
                   f"scale, previous {n} steps; threshold {threshold:g})")
    else:
        against = f"its running mean {mean:.4g} (sd {sd:.3g}, previous {n} steps; threshold {threshold:g})"
    return (f"[stapo] collapse warning at step {step}: {signal} = {value:.4g} is {abs(z):.1f} sd {direction} "
            f"{against}. {where} No action taken.")
