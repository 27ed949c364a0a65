"""Overlay of several runs (STAPO, GRPO, ablations) on the same four curves (:mod:`stapo_verl.plots.curves`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stapo_verl.plots.curves import plot_curves, val_keys  # noqa: E402
from stapo_verl.plots.loading import VAL_GENERATIONS_DIR, read_metrics, read_val_generations  # noqa: E402
from stapo_verl.plots.report import default_metrics_file, validation_summary  # noqa: E402


def overlay(run_dirs: list, out, labels: list[str] | None = None):
    """Plot each run's ``RUN_DIR/metrics.jsonl`` (its latest invocation) on shared axes and save to ``out``.

    Validation accuracy gets ±1 SE error bars for runs whose ``RUN_DIR/val_generations`` dump allows them
    (:func:`stapo_verl.plots.report.validation_summary`).

    Args:
        run_dirs: run directories, drawn in this order.
        out: PNG path (parents created).
        labels: legend labels, one per run (default: the directory names).

    Returns:
        The saved ``matplotlib.figure.Figure`` (closed; its axes stay readable).

    Raises:
        ValueError: ``labels`` of the wrong length, or two runs with the same label (their curves would be
            indistinguishable).
        FileNotFoundError: a run dir without ``metrics.jsonl``.
    """
    run_dirs = [Path(d) for d in run_dirs]
    labels = list(labels) if labels else [d.name for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"--labels has {len(labels)} entries for {len(run_dirs)} runs; give one per run")
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"label(s) {dup} repeated; pass distinct --labels")
    runs, se = {}, {}
    for lab, d in zip(labels, run_dirs):
        m = runs[lab] = read_metrics(default_metrics_file(d))
        val = validation_summary(m, read_val_generations(d / VAL_GENERATIONS_DIR, set(m)), len(val_keys(m)))
        se[lab] = {src: v["se_by_step"] for src, v in val.items()}
    fig = plot_curves(runs, out, val_se=se)
    plt.close(fig)
    return fig
