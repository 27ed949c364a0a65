"""Training curves of one or several runs: entropy, validation accuracy, reward, masked fraction.

Metric names are verl 0.9.1's (``verl/trainer/ppo/v1/trainer_base.py``, ``ray_trainer.py::_val_metrics_update``,
``metric_utils.py``) and the plugin's ``actor/stapo/*`` (README "Metrics"):

* ``actor/entropy`` — token-mean entropy (nats) of the old policy on the rollout, logged when the trainer
  computes old log-probs with entropy (it does for ``stats_source=old_policy``);
* ``val-core/<data_source>/acc/mean@N`` — validation accuracy per data source, N samples per prompt
  (``val-core/<data_source>/reward/mean@N`` when the reward function returns no ``acc``);
* ``critic/score/mean`` — mean sequence reward of the training rollout;
* ``actor/stapo/masked_frac`` — silenced ÷ valid response tokens (absent for verl's ``vanilla``, i.e. GRPO).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

Metrics = dict[int, dict[str, float]]

ENTROPY = "actor/entropy"
REWARD = "critic/score/mean"
MASKED_FRAC = "actor/stapo/masked_frac"
NUM_MASKED = "actor/stapo/num_masked"
_VAL_CORE = re.compile(r"^val-core/(?P<src>.+)/(?P<var>acc|reward)/mean@(?P<n>\d+)$")
_TRAIN_MARKERS = ("actor/pg_loss", "training/global_step", REWARD)


def val_keys(metrics: Metrics) -> dict[str, str]:
    """``{data_source: key}`` of each source's validation-accuracy metric ``val-core/<src>/acc/mean@N``.

    Per source: ``acc`` if logged, else ``reward``; the largest N if several appear.
    """
    best: dict[str, tuple[int, int, str]] = {}
    for key in {k for row in metrics.values() for k in row}:
        m = _VAL_CORE.match(key)
        if m:
            rank = (int(m["var"] == "acc"), int(m["n"]), key)
            best[m["src"]] = max(best.get(m["src"], rank), rank)
    return {src: best[src][2] for src in sorted(best)}


def series(metrics: Metrics, key: str) -> tuple[list[int], list[float]]:
    """Steps where ``key`` was logged with a finite value, and those values (ascending step)."""
    steps = sorted(s for s, row in metrics.items() if key in row and math.isfinite(row[key]))
    return steps, [metrics[s][key] for s in steps]


def training_steps(metrics: Metrics) -> list[int]:
    """Steps that ran a training update (a row holding ``actor/pg_loss``, ``training/global_step`` or the
    rollout reward); validation-only rows (e.g. ``val_before_train`` of a run resumed at its last step) are not."""
    return sorted(s for s, row in metrics.items() if any(k in row for k in _TRAIN_MARKERS))


def _panel(ax, runs: dict[str, Metrics], keys_of, title: str, ylabel: str, err=None) -> None:
    drawn = False
    for label, m in runs.items():
        keys = keys_of(m)
        for name, key in keys.items():
            st, v = series(m, key)
            if st:
                line, = ax.plot(st, v, marker="o" if len(st) < 12 else None, ms=3,
                                label=f"{label}: {name}" if len(keys) > 1 else label)
                se = (err or {}).get(label, {}).get(name, {})
                es = [s for s in st if s in se]
                if es:  # ± 1 standard error over prompts, where the validation dump gives it
                    ax.errorbar(es, [m[s][key] for s in es], yerr=[se[s] for s in es], fmt="none",
                                ecolor=line.get_color(), capsize=3, lw=1)
                drawn = True
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel, fontsize=8)
    if drawn:
        ax.legend(fontsize=6)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def plot_curves(runs: dict[str, Metrics], out=None, val_se: dict | None = None):
    """2×2 figure of :data:`ENTROPY`, every source's validation accuracy, :data:`REWARD`, :data:`MASKED_FRAC`.

    Args:
        runs: ``{label: metrics}`` (several runs overlay on the same axes).
        out: PNG path to write (parents created), or ``None`` to only build the figure.
        val_se: optional ``{label: {data_source: {step: standard error}}}``, drawn as ±1 SE error bars on the
            validation-accuracy curves (:func:`stapo_verl.plots.report.validation_summary`'s ``se_by_step``).

    Returns:
        The ``matplotlib.figure.Figure`` (axes in reading order: entropy, val accuracy, reward, masked fraction;
        panels with nothing logged say "not logged"). The caller closes it (``plt.close(fig)``).
    """
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    one = len(runs) == 1
    _panel(axes[0, 0], runs, lambda m: {"entropy": ENTROPY}, f"entropy ({ENTROPY})", "nats / token")
    _panel(axes[0, 1], runs, lambda m: val_keys(m), "validation accuracy (val-core/<source>/acc/mean@N)",
           "accuracy" + (" (± 1 SE over prompts)" if val_se else ""), err=val_se)
    _panel(axes[1, 0], runs, lambda m: {"reward": REWARD}, f"mean reward ({REWARD})", "score")
    _panel(axes[1, 1], runs, lambda m: {"masked": MASKED_FRAC}, f"masked fraction ({MASKED_FRAC})",
           "silenced / valid tokens")
    if one:  # single run: the legend entry would repeat the run name in every panel
        for ax in (axes[0, 0], axes[1, 0], axes[1, 1]):
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        fig.suptitle(next(iter(runs)), fontsize=10)
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig
