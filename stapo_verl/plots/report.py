"""Per-run report: ``plot.png``, ``scatter.png``, ``summary.json`` and ``summary.md`` of the steps of ONE metrics file.

What is covered: the metrics file given (default ``RUN_DIR/metrics.jsonl``: with the tiny recipes every step of the
run, one row a step, across resumes; for ``main_ppo`` run directly, verl's file logger truncates it when an
invocation starts, see :mod:`stapo_verl.plots.loading`), its training steps, and the token-dump rows and validation
generations of exactly those steps. Rows of other steps (an earlier run in the same run dir) are counted as
excluded, never reported.

Validation accuracy comes with its standard error over prompts, SE = sd(m_i) / √n, where m_i is prompt i's
mean accuracy over its N samples (samples of one prompt are correlated, so the prompt is the unit). It needs
verl's validation dump (``trainer.validation_data_dir``, default looked up at ``RUN_DIR/val_generations``); the
metrics alone do not hold the number of prompts.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stapo_verl.plots.curves import (  # noqa: E402
    ENTROPY,
    MASKED_FRAC,
    NUM_MASKED,
    REWARD,
    plot_curves,
    series,
    training_steps,
    val_keys,
)
from stapo_verl.plots.loading import (  # noqa: E402
    METRICS_FILE,
    TOKEN_DUMP_PATTERN,
    VAL_GENERATIONS_DIR,
    find_token_files,
    read_metrics,
    read_tokens,
    read_val_generations,
)
from stapo_verl.plots.scatter import plot_scatter  # noqa: E402

TOP_TOKENS = 10
CONTEXTS_PER_TOKEN = 2


class Report(NamedTuple):
    """What :func:`write_report` returns: the summary dict and the two figures (already saved and closed)."""

    summary: dict
    curves: object
    scatter: object


def default_metrics_file(run_dir: Path) -> Path:
    """``RUN_DIR/metrics.jsonl`` (this invocation's file logger output).

    Raises:
        FileNotFoundError: it is missing; lists the other ``metrics*.jsonl`` there, to pass one as ``--metrics``.
    """
    path = run_dir / METRICS_FILE
    if not path.is_file():
        others = sorted(p.name for p in run_dir.glob("metrics*.jsonl"))
        raise FileNotFoundError(f"{path} not found" + (f"; the run dir holds {others}: pass one as --metrics"
                                                        if others else " (set trainer.logger=[console,file])"))
    return path


def _prompt_means(rows: list[dict], var: str) -> dict[str, float]:
    """``{prompt text: mean of var over its samples}``; verl's dump has no uid, the decoded prompt stands in."""
    by_prompt: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = r.get(var)
        if v is not None:
            by_prompt[str(r.get("input"))].append(float(v))
    return {k: sum(v) / len(v) for k, v in by_prompt.items()}


def _se(values: list[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def source_prompt_means(rows: list[dict] | None, src: str, var: str, sources_total: int, val_dir=None):
    """Per-prompt means of ``var`` over one validation step's dump rows of data source ``src``.

    Returns:
        ``(means, note)``: ``means`` is ``{prompt: mean}`` or ``None`` with ``note`` saying why (no dump for the
        step, or rows without ``data_source`` in a run with several validation sources — nothing is guessed).
    """
    if rows is None:
        return None, (f"no validation dump for this step (set trainer.validation_data_dir; looked in "
                      f"{val_dir or 'RUN_DIR/' + VAL_GENERATIONS_DIR})")
    if any("data_source" in r for r in rows):
        rows = [r for r in rows if r.get("data_source") == src]
    elif sources_total != 1:
        return None, (f"the validation dump has no data_source and the run validates on {sources_total} sources, "
                      "so rows cannot be attributed (return data_source from the reward function)")
    return _prompt_means(rows, var), None


def validation_summary(metrics, val_rows: dict[int, list[dict]], sources_total: int, val_dir=None) -> dict:
    """Start → end validation accuracy per data source, with standard errors when the dump allows.

    Args:
        metrics: this invocation's ``{step: {metric: value}}``.
        val_rows: verl's validation dump ``{step: rows}`` (may be empty).
        sources_total: number of validation sources in the metrics (rows without ``data_source`` can only be
            attributed when it is 1).
        val_dir: where the dump was looked for (named in ``se_note``).

    Returns:
        ``{source: {"key", "start": {"step", "value", "se", "n_prompts", "dump_mean"}, "end": {...}, "delta",
        "delta_se", "se_by_step", "se_note"}}``; ``se``/``delta_se`` are ``None`` with ``se_note`` saying why
        when unknown. ``delta_se`` is the paired SE sd(m_i,end − m_i,start)/√n over prompts present at both
        steps; ``se_by_step`` maps every validated step with a known SE to it (error bars of the curves).
    """
    out = {}
    for src, key in val_keys(metrics).items():
        var = key.split("/")[-2]
        dump_var = "acc" if var == "acc" else "score"
        steps, vals = series(metrics, key)
        if not steps:
            continue
        ent: dict = {"key": key, "se_note": None, "se_by_step": {}}
        means_at: dict[int, dict[str, float]] = {}
        for s in steps:
            means, note = source_prompt_means(val_rows.get(s), src, dump_var, sources_total, val_dir)
            if means:
                means_at[s] = means
                if (se := _se(list(means.values()))) is not None:
                    ent["se_by_step"][s] = se
            elif note and s in (steps[0], steps[-1]):
                ent["se_note"] = f"step {s}: {note}"
        for tag, s, v in (("start", steps[0], vals[0]), ("end", steps[-1], vals[-1])):
            m = means_at.get(s)
            ent[tag] = {"step": s, "value": v, "se": ent["se_by_step"].get(s), "n_prompts": len(m) if m else None,
                        "dump_mean": sum(m.values()) / len(m) if m else None}
        ent["delta"] = ent["end"]["value"] - ent["start"]["value"]
        ent["delta_se"] = None
        if len(steps) > 1 and steps[0] in means_at and steps[-1] in means_at:
            a, b = means_at[steps[0]], means_at[steps[-1]]
            ent["delta_se"] = _se([b[k] - a[k] for k in sorted(set(a) & set(b))])
        out[src] = ent
    return out


def token_summary(rows: list[dict], steps: set[int], top: int = TOP_TOKENS) -> dict:
    """Counts of this invocation's dumped rows and its most frequently silenced tokens.

    Args:
        rows: every token-dump row found; only those with ``step`` in ``steps`` are used.
        steps: this invocation's training steps.
        top: how many tokens to list.

    Returns:
        ``{"rows", "silenced", "kept", "excluded_other_steps", "steps_with_rows", "loss_modes", "stats_sources",
        "top_silenced": [{"token_id", "token", "count", "share", "mean_p", "mean_entropy", "contexts"}]}``;
        ``share`` is the fraction of dumped silenced rows; ties in count are broken by token id.
    """
    mine = [r for r in rows if r["step"] in steps]
    sil = [r for r in mine if r["kind"] == "silenced"]
    counts = Counter(r["token_id"] for r in sil)
    top_rows = []
    for tid, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        these = [r for r in sil if r["token_id"] == tid]
        top_rows.append({
            "token_id": tid, "token": these[0]["token"], "count": c, "share": c / len(sil),
            "mean_p": sum(r["p"] for r in these) / c, "mean_entropy": sum(r["entropy"] for r in these) / c,
            "contexts": [r["context"] for r in these[:CONTEXTS_PER_TOKEN]],
        })
    return {
        "rows": len(mine), "silenced": len(sil), "kept": len(mine) - len(sil),
        "excluded_other_steps": len(rows) - len(mine),
        "steps_with_rows": sorted({r["step"] for r in mine}),
        "loss_modes": sorted({r["loss_mode"] for r in mine}),
        "stats_sources": sorted({r["stats_source"] for r in mine}),
        "top_silenced": top_rows,
    }


def _wall_seconds(run_dir: Path, metrics_file: Path, given: float | None) -> tuple[float | None, str | None]:
    """``given``, else ``RUN_DIR/wall.json`` (the recipe writes it right after training) when it is not older
    than the metrics file, i.e. belongs to the same invocation."""
    if given is not None:
        return given, "--wall-seconds"
    wall = run_dir / "wall.json"
    if wall.is_file() and wall.stat().st_mtime >= metrics_file.stat().st_mtime:
        return json.loads(wall.read_text()).get("wall_seconds"), str(wall)
    return None, None


def summarize(run_dir, metrics_file=None, tokens_glob=None, val_dir=None, wall_seconds=None) -> tuple[dict, list]:
    """The summary of one invocation, and its token rows (for the scatter).

    Args:
        run_dir: the run directory.
        metrics_file: this invocation's metrics JSONL (default :func:`default_metrics_file`).
        tokens_glob: token-dump glob (default ``RUN_DIR/**/stapo_tokens.dp*.jsonl``).
        val_dir: verl's validation dump directory (default ``RUN_DIR/val_generations``).
        wall_seconds: wall time of the invocation, if the caller measured it.

    Returns:
        ``(summary, rows)``: ``summary`` is JSON-serialisable (keys documented in ``summary.md``'s sections;
        ``steps`` is the number of training steps this invocation ran), ``rows`` the dump rows of its steps.

    Raises:
        FileNotFoundError: no metrics file; :class:`~stapo_verl.plots.loading.RunFileError`: a malformed file.
    """
    run_dir = Path(run_dir)
    mfile = Path(metrics_file) if metrics_file is not None else default_metrics_file(run_dir)
    m = read_metrics(mfile)
    train = training_steps(m)
    s: dict = {"run": str(run_dir), "metrics_file": str(mfile),
               "other_metrics_files": sorted(str(p) for p in run_dir.glob("metrics*.jsonl") if p != mfile),
               "steps": len(train), "first_step": train[0] if train else None,
               "last_step": train[-1] if train else None, "logged_steps": sorted(m)}
    s["wall_seconds"], s["wall_source"] = _wall_seconds(run_dir, mfile, wall_seconds)
    vdir = Path(val_dir) if val_dir is not None else run_dir / VAL_GENERATIONS_DIR
    s["validation"] = validation_summary(m, read_val_generations(vdir, set(m)), len(val_keys(m)), vdir)
    for name, key in (("reward", REWARD), ("entropy", ENTROPY), ("masked_frac", MASKED_FRAC)):
        st, v = series(m, key)
        st_v = [(a, b) for a, b in zip(st, v) if a in set(train)]
        s[name] = None if not st_v else {
            "key": key, "first": st_v[0][1], "last": st_v[-1][1], "first_step": st_v[0][0],
            "last_step": st_v[-1][0], "mean": sum(b for _, b in st_v) / len(st_v),
            "mean_last5": sum(b for _, b in st_v[-5:]) / len(st_v[-5:])}
    st, v = series(m, NUM_MASKED)
    s["num_masked_logged_sum"] = sum(b for a, b in zip(st, v) if a in set(train)) if st else None
    files = find_token_files(run_dir, tokens_glob)
    s["token_dump"] = {"files": [str(f) for f in files],
                       "pattern": str(tokens_glob) if tokens_glob else f"{run_dir}/**/{TOKEN_DUMP_PATTERN}"}
    rows = read_tokens(files) if files else []
    if files:
        s["token_dump"].update(token_summary(rows, set(train)))
    return s, [r for r in rows if r["step"] in set(train)]


def _md_cell(text: str) -> str:
    """One markdown table cell: backslashes, pipes and angle brackets escaped, newlines shown as ⏎ (contexts are
    raw decoded text, e.g. ``\\boxed{`` or ``<|im_end|>``)."""
    text = str(text).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("\r", "").replace("\n", "⏎")


def _fmt_point(p: dict) -> str:
    txt = f"{p['value']:.3f}"
    if p["se"] is not None:
        txt += f" ± {p['se']:.3f} (n = {p['n_prompts']} prompts)"
    return txt + f" @ step {p['step']}"


def to_markdown(s: dict) -> str:
    """``summary.md`` text of a :func:`summarize` result."""
    name = Path(s["run"]).name
    L = [f"# {name}", "", "## This invocation", f"- metrics: `{s['metrics_file']}`"]
    if s["other_metrics_files"]:
        names = ", ".join(f"`{Path(p).name}`" for p in s["other_metrics_files"])
        L.append(f"- not included (other invocations): {names}")
    if s["steps"]:
        L.append(f"- training steps run: {s['steps']} (steps {s['first_step']}–{s['last_step']})")
    else:
        L.append("- training steps run: 0 (no training update was logged: the run was already complete, or it "
                 "failed before its first step; start a new run in a new run dir)")
    wall = s["wall_seconds"]
    L.append(f"- wall time: {wall} s" if wall is not None else "- wall time: not measured (pass --wall-seconds)")
    L += ["", "## Validation accuracy (start → end, ± standard error over prompts)"]
    if not s["validation"]:
        L.append("- no val-core/<source>/acc/mean@N metric was logged")
    for src, v in s["validation"].items():
        line = f"- {src} (`{v['key']}`): {_fmt_point(v['start'])} → {_fmt_point(v['end'])}; Δ = {v['delta']:+.3f}"
        if v["delta_se"] is not None:
            line += f" ± {v['delta_se']:.3f} (paired)"
        L.append(line)
        if v["se_note"]:
            L.append(f"  - standard error unavailable: {v['se_note']}")
    L += ["", "## Training"]
    for name, label in (("reward", "mean reward"), ("entropy", "entropy (nats/token)"),
                        ("masked_frac", "masked fraction")):
        r = s[name]
        if r is None:
            L.append(f"- {label}: not logged")
        else:
            L.append(f"- {label} (`{r['key']}`): {r['first']:.4g} (step {r['first_step']}) → {r['last']:.4g} "
                     f"(step {r['last_step']}); mean {r['mean']:.4g}, mean of last 5 steps {r['mean_last5']:.4g}")
    if s["num_masked_logged_sum"] is not None:
        L.append(f"- silenced tokens, Σ over steps of `{NUM_MASKED}`: {s['num_masked_logged_sum']:g} (verl logs the "
                 f"mean over a step's mini-batches; with one mini-batch per step this is the total)")
    td = s["token_dump"]
    L += ["", "## Silenced tokens (token dump)"]
    if not td["files"]:
        L.append(f"- no token dump found (looked for `{td['pattern']}`); the plugin writes it when token dumping is on")
        return "\n".join(L) + "\n"
    L.append(f"- {len(td['files'])} file(s); rows of this invocation's steps: {td['rows']} "
             f"({td['silenced']} silenced, {td['kept']} kept candidates sampled for contrast)"
             + (f"; {td['excluded_other_steps']} rows of other steps excluded" if td["excluded_other_steps"] else ""))
    if td["loss_modes"]:
        L.append(f"- loss_mode {', '.join(td['loss_modes'])}; stats_source {', '.join(td['stats_sources'])}")
    if not td["top_silenced"]:
        L.append("- no silenced token in this invocation's dump")
        return "\n".join(L) + "\n"
    L += ["", f"Most frequently silenced tokens (of {td['silenced']} dumped):", "",
          "| # | token | id | count | share | mean p | mean H (nats) | context |", "|---|---|---|---|---|---|---|---|"]
    for i, t in enumerate(td["top_silenced"], 1):
        ctx = "<br>".join(_md_cell(c) for c in t["contexts"])
        L.append(f"| {i} | {_md_cell(json.dumps(t['token'], ensure_ascii=False))} | {t['token_id']} | {t['count']} | "
                 f"{t['share']:.1%} | {t['mean_p']:.3g} | {t['mean_entropy']:.3g} | {ctx} |")
    return "\n".join(L) + "\n"


def write_report(run_dir, metrics_file=None, tokens_glob=None, val_dir=None, wall_seconds=None) -> Report:
    """Write ``plot.png``, ``scatter.png``, ``summary.json``, ``summary.md`` into ``run_dir`` (args as
    :func:`summarize`) and return them as a :class:`Report` (figures closed after saving)."""
    run_dir = Path(run_dir)
    s, rows = summarize(run_dir, metrics_file, tokens_glob, val_dir, wall_seconds)
    curves = plot_curves({run_dir.name: read_metrics(s["metrics_file"])}, run_dir / "plot.png",
                         val_se={run_dir.name: {src: v["se_by_step"] for src, v in s["validation"].items()}})
    if s["token_dump"]["files"]:
        reason = "no dumped candidate in this invocation's steps"
    else:
        reason = f"no token dump found\n({s['token_dump']['pattern']})"
    scatter = plot_scatter(rows, run_dir / "scatter.png", title=f"{run_dir.name}: S2T candidates, steps "
                           f"{s['first_step']}–{s['last_step']}", missing_reason=reason)
    plt.close(curves)
    plt.close(scatter)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=1, ensure_ascii=False) + "\n")
    (run_dir / "summary.md").write_text(to_markdown(s))
    return Report(s, curves, scatter)
