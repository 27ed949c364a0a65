"""Plots and summaries of tiny CPU runs from verl's JSONL ``file`` logger (``verl/utils/tracking.py:529``).

Usage::

    python -m stapo_verl.cpu.plot --run outputs/tiny_cpu_stapo [--wall-seconds S]
        → RUN/plot.png, RUN/summary.json, RUN/summary.md
    python -m stapo_verl.cpu.plot --overlay outputs/tiny_cpu_stapo outputs/tiny_cpu_grpo --out overlay.png

Each JSONL line is ``{"step": int, "data": {metric: value}}``; a run dir may hold several files
(``metrics.jsonl`` plus ``metrics.<ts>.jsonl`` from earlier invocations before a resume); later files win.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYNTH_SOURCE = "math_dapo"


def load_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Merge every ``metrics*.jsonl`` in ``run_dir`` into ``{step: {metric: value}}``.

    Raises:
        FileNotFoundError: no ``metrics*.jsonl`` in ``run_dir``.
    """
    files = sorted(run_dir.glob("metrics*.jsonl"), key=lambda p: (p.name == "metrics.jsonl", p.name))
    if not files:
        raise FileNotFoundError(f"no metrics*.jsonl in {run_dir} (was trainer.logger=[console,file] set?)")
    out: dict[int, dict[str, float]] = {}
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            row = out.setdefault(int(rec["step"]), {})
            for k, v in rec["data"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[k] = float(v)
    return out


def val_acc_key(metrics: dict[int, dict[str, float]], source: str = SYNTH_SOURCE):
    """The ``val-core/<source>/acc/mean@N`` key present in ``metrics`` (largest N), or ``None``."""
    pat = re.compile(rf"^val-core/{re.escape(source)}/acc/mean@(\d+)$")
    keys = {k for row in metrics.values() for k in row if pat.match(k)}
    return max(keys, key=lambda k: int(pat.match(k).group(1))) if keys else None


def series(metrics: dict[int, dict[str, float]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` (steps where it was logged)."""
    steps = sorted(s for s, row in metrics.items() if key in row and not math.isnan(row[key]))
    return steps, [metrics[s][key] for s in steps]


def masked_keys(metrics: dict[int, dict[str, float]]) -> list[str]:
    """``actor/stapo/*_frac`` keys (masked and candidate fractions of the valid response tokens)."""
    keys = {k for row in metrics.values() for k in row if k.startswith("actor/stapo/")}
    return sorted(k for k in keys if k.endswith("_frac"))


def summarize(run_dir: Path, wall_seconds: float | None = None) -> dict:
    """Accuracy before → after, reward, masked fraction and wall time of one run (also written to disk)."""
    m = load_metrics(run_dir)
    out: dict = {"run": str(run_dir), "steps": max(m) if m else 0}
    k = val_acc_key(m)
    if k:
        st, vals = series(m, k)
        out.update(val_key=k, acc_before=vals[0], acc_after=vals[-1], acc_steps=[st[0], st[-1]])
    other = sorted({kk for row in m.values() for kk in row if re.match(r"^val-core/.+/acc/mean@\d+$", kk)} - {k})
    out["other_val"] = {kk: series(m, kk)[1][-1] for kk in other}
    st, r = series(m, "critic/score/mean")
    if r:
        out.update(reward_first=r[0], reward_last=r[-1], reward_last5=sum(r[-5:]) / len(r[-5:]))
    mk = masked_keys(m)
    out["stapo_metrics"] = {kk: sum(series(m, kk)[1]) / max(1, len(series(m, kk)[1])) for kk in mk}
    if wall_seconds is None and (run_dir / "wall.json").exists():
        wall_seconds = json.loads((run_dir / "wall.json").read_text()).get("wall_seconds")
    out["wall_seconds"] = wall_seconds
    return out


def _panel(ax, runs: dict[str, dict[int, dict[str, float]]], keys_fn, title: str):
    drawn = False
    for label, m in runs.items():
        keys = keys_fn(m)
        for key in keys:
            st, v = series(m, key)
            if st:
                ax.plot(st, v, marker="o" if len(st) < 12 else None, ms=3,
                        label=f"{label}: {key.split('/')[-1]}" if len(keys) > 1 else label)
                drawn = True
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    if drawn:
        ax.legend(fontsize=6)
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)


def plot_runs(runs: dict[str, dict[int, dict[str, float]]], out: Path) -> Path:
    """2×2 figure: validation accuracy, mean reward, entropy, ``actor/stapo/*`` masked fraction."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    _panel(axes[0, 0], runs, lambda m: [k] if (k := val_acc_key(m)) else [], f"val accuracy ({SYNTH_SOURCE})")
    _panel(axes[0, 1], runs, lambda m: ["critic/score/mean"], "mean reward (critic/score/mean)")
    _panel(axes[1, 0], runs, lambda m: ["actor/entropy"], "entropy (actor/entropy)")
    _panel(axes[1, 1], runs, masked_keys, "actor/stapo/* masked fraction")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def write_run_outputs(run_dir: Path, wall_seconds: float | None = None) -> dict:
    """Write ``plot.png``, ``summary.json`` and ``summary.md`` into ``run_dir``; return the summary."""
    s = summarize(run_dir, wall_seconds)
    plot_runs({run_dir.name: load_metrics(run_dir)}, run_dir / "plot.png")
    (run_dir / "summary.json").write_text(json.dumps(s, indent=1))
    lines = [f"# {run_dir.name}", ""]
    if "acc_before" in s:
        lines.append(f"- validation accuracy ({s['val_key']}): {s['acc_before']:.3f} (step {s['acc_steps'][0]})"
                     f" → {s['acc_after']:.3f} (step {s['acc_steps'][1]})")
    if "reward_first" in s:
        lines.append(f"- mean reward: {s['reward_first']:.3f} (step 1) → {s['reward_last']:.3f} "
                     f"(last; mean of last 5: {s['reward_last5']:.3f})")
    for k, v in s["other_val"].items():
        lines.append(f"- {k} (last): {v:.3f}")
    for k, v in s["stapo_metrics"].items():
        lines.append(f"- {k} (mean over steps): {v:.4f}")
    lines.append(f"- training steps: {s['steps']}; wall time: {s['wall_seconds']} s")
    (run_dir / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return s


def main(argv=None) -> int:
    """CLI: ``--run DIR`` (plot + summary) or ``--overlay DIR [DIR ...] --out PNG``."""
    ap = argparse.ArgumentParser(description="plot tiny CPU runs")
    ap.add_argument("--run", type=Path)
    ap.add_argument("--wall-seconds", type=float, default=None)
    ap.add_argument("--overlay", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=Path("outputs/tiny_cpu_overlay.png"))
    a = ap.parse_args(argv)
    if not a.run and not a.overlay:
        ap.error("give --run DIR or --overlay DIR [DIR ...]")
    if a.run:
        write_run_outputs(a.run, a.wall_seconds)
    if a.overlay:
        p = plot_runs({d.name: load_metrics(d) for d in a.overlay}, a.out)
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
