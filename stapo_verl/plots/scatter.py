"""p–H scatter of the dumped S2T candidates, silenced ones highlighted, with the τ_p and τ_h thresholds.

The STAPO paper's view of spurious tokens (arXiv 2602.15620, §3, S2T): a positive-advantage token is silenced
when its probability is below τ_p and its entropy below τ_h (the ``entropy_quantile`` quantile of the
candidates' entropies, one τ_h per optimizer mini-batch). The dump (:mod:`stapo_verl.plots.loading`) holds the
silenced candidates and an equal-size random sample of the kept ones, so the two classes are drawn together.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SILENCED_COLOR = "tab:red"
KEPT_COLOR = "tab:gray"


def tau_h_per_minibatch(rows: list[dict]) -> dict[tuple[int, int], float]:
    """``{(step, minibatch): τ_h}`` over rows whose ``tau_h`` is not null (one value per mini-batch is
    expected; the first row's wins if the dump disagrees)."""
    out: dict[tuple[int, int], float] = {}
    for r in rows:
        if r["tau_h"] is not None:
            out.setdefault((r["step"], r["minibatch"]), float(r["tau_h"]))
    return out


def plot_scatter(rows: list[dict], out=None, title: str = "", missing_reason: str | None = None):
    """Scatter of ``p`` (log x axis) against ``entropy`` (nats, y axis) of the dumped candidates.

    Kept candidates are grey, silenced red; a dashed vertical line marks τ_p (one per distinct ``tau_p``), a
    dashed horizontal line the median τ_h over the dumped mini-batches with its min–max range shaded.
    ``p == 0`` (an underflowed probability) cannot sit on a log axis: such points are drawn at a floor a decade
    below the smallest positive p and counted in the legend.

    Args:
        rows: token-dump rows (:func:`stapo_verl.plots.loading.read_tokens`), possibly empty.
        out: PNG path to write, or ``None``.
        title: figure title.
        missing_reason: the text drawn instead of points when ``rows`` is empty.

    Returns:
        The ``matplotlib.figure.Figure``; its single axes has ``xscale == "log"``. The caller closes it.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    ax.set_xlabel("token probability p (log scale)")
    ax.set_ylabel("entropy H (nats)")
    ax.set_title(title or "S2T candidates (Â > 0, p < τ_p)", fontsize=9)
    ax.set_xscale("log")
    if not rows:
        ax.text(0.5, 0.5, missing_reason or "no token dump", ha="center", va="center", wrap=True,
                transform=ax.transAxes, fontsize=9)
        ax.set_xlim(1e-6, 1)
        ax.set_ylim(0, 1)
    else:
        positive = [r["p"] for r in rows if r["p"] > 0]
        floor = (min(positive) if positive else 1e-12) / 10
        for kind, color, z in (("kept", KEPT_COLOR, 2), ("silenced", SILENCED_COLOR, 3)):
            sel = [r for r in rows if r["kind"] == kind]
            label = f"{kind} ({len(sel)})"
            zeros = sum(1 for r in sel if r["p"] <= 0)
            if zeros:
                label += f", {zeros} with p=0 at {floor:.0e}"
            ax.scatter([max(r["p"], floor) for r in sel], [r["entropy"] for r in sel], s=10, c=color,
                       alpha=0.6 if kind == "kept" else 0.85, label=label, zorder=z, edgecolors="none")
        for tau_p in sorted({float(r["tau_p"]) for r in rows}):
            ax.axvline(tau_p, color="k", ls="--", lw=1, label=f"τ_p = {tau_p:g}")
        taus = list(tau_h_per_minibatch(rows).values())
        if taus:
            med = statistics.median(taus)
            ax.axhline(med, color="tab:blue", ls="--", lw=1,
                       label=f"τ_h median {med:.3g} nats ({len(taus)} mini-batches)")
            if max(taus) > min(taus):
                ax.axhspan(min(taus), max(taus), color="tab:blue", alpha=0.1, lw=0,
                           label=f"τ_h range {min(taus):.3g}–{max(taus):.3g}")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig
