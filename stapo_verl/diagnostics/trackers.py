"""Silenced-token tables and mask histograms, written through verl's own ``Tracking`` object.

verl's ``Tracking`` (``verl.utils.tracking``, built from ``trainer.logger``) logs scalars: its TensorBoard adapter
calls ``add_scalar`` on every value and its MLflow adapter ``log_metrics``. Tables and histograms therefore go to
each configured backend in the form that backend has for them, reached through ``Tracking.logger[<backend>]`` (or
``Tracking.log(..., backend=[<backend>])`` where verl's adapter passes the object through unchanged):

==============  ==============================================  ================================================
backend         token table (key :data:`TABLE_KEY`)             histograms (``actor/stapo/hist/<name>``)
==============  ==============================================  ================================================
``wandb``       ``wandb.Table`` (columns: the dump's schema)     ``wandb.Histogram(np_histogram=...)``
``tensorboard`` text summary: a markdown table                   ``SummaryWriter.add_histogram_raw``
                (:data:`TEXT_COLUMNS`)
``mlflow``      ``mlflow.log_table`` artifact                    — (no histogram type; the scalars are logged)
                ``stapo_tokens/step_<step>.json``
``swanlab``     ``swanlab.echarts.Table``                        —
``clearml``     ``report_table`` (a ``pandas.DataFrame``, through —
                verl's ClearML adapter)
``console``     the top-k silenced tokens, one line each         —
``file``        the same top-k lines under                       —
                ``actor/stapo/tokens_top`` in verl's metrics JSONL
==============  ==============================================  ================================================

``trackio``, ``vemlp_wandb`` and ``rl_insight`` get only the scalars: verl's adapters for them pass plain values
(``rl_insight`` keeps gauges only). A backend that fails is reported on the console and skipped; training goes on.
The complete record stays the JSONL dump (:mod:`stapo_verl.minibatch.token_dump`).
"""

from __future__ import annotations

import math
from collections import defaultdict

from stapo_verl.minibatch.dump_schema import SCHEMA

#: tracker key of the token table
TABLE_KEY = "actor/stapo/tokens"
#: ``file`` backend key of the top-k lines
TOP_KEY = "actor/stapo/tokens_top"
#: prefix of the histogram keys
HIST_PREFIX = "actor/stapo/hist/"
#: silenced tokens printed on the console / written to the file logger
TOP_K = 10
#: columns of the TensorBoard text table (the dump's schema without what is constant in one table — step, τ_p,
#: loss_mode, stats_source — which the title gives; the wandb / MLflow / SwanLab / ClearML tables keep every column)
TEXT_COLUMNS = ("kind", "token", "context", "p", "entropy", "advantage", "tau_h", "minibatch", "dp_rank",
                "sample_index", "position", "token_id")


def _warn(backend: str, what: str, error: Exception) -> None:
    print(f"[stapo] could not log the {what} to {backend}: {type(error).__name__}: {error}", flush=True)


def start_tensorboard_session(tracking, step: int) -> bool:
    """Mark in verl's TensorBoard file that this process starts writing at ``step``: TensorBoard then hides every
    event of an earlier invocation at ``step`` or later (a run killed after its checkpoint trains those steps again).

    The marker is a ``SessionLog.START`` event, what ``torch.utils.tensorboard.SummaryWriter(purge_step=step)`` writes
    (verl's ``_TensorboardAdapter`` creates its writer without ``purge_step``). TensorBoard's reader takes the first
    marker of a run as its start and purges on every later one (``purge_orphaned_data``, its default), so every
    invocation writes one at its first step, a fresh start included.

    Returns:
        True when ``tracking`` has a TensorBoard backend and the marker was written.
    """
    backends = getattr(tracking, "logger", {}) or {}
    if "tensorboard" not in backends:
        return False
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        writer = backends["tensorboard"].writer
        writer.file_writer.add_event(Event(step=int(step), session_log=SessionLog(status=SessionLog.START)))
        writer.flush()
    except Exception as e:  # a tracker problem must not stop training
        _warn("tensorboard", "the session start marker", e)
        return False
    return True


def log_histograms(tracking, histograms: dict, step: int) -> list[str]:
    """Write the non-empty histograms to every backend of ``tracking`` that has a histogram type.

    Args:
        tracking: verl's ``Tracking`` (``PPOTrainer.logger``). histograms: name →
            :class:`stapo_verl.diagnostics.stats.Histogram`. step: verl's global step.

    Returns:
        The backends written (``wandb``, ``tensorboard``).
    """
    hists = {name: h for name, h in histograms.items() if h.num > 0}
    done = []
    if not hists:
        return done
    for backend in list(getattr(tracking, "logger", {})):
        try:
            if backend == "wandb":
                import numpy as np
                import wandb

                tracking.log({HIST_PREFIX + name: wandb.Histogram(np_histogram=(np.asarray(h.counts),
                                                                                np.asarray(h.edges)))
                              for name, h in hists.items()}, step=step, backend=["wandb"])
            elif backend == "tensorboard":
                writer = tracking.logger["tensorboard"].writer
                for name, h in hists.items():
                    writer.add_histogram_raw(HIST_PREFIX + name, min=h.low, max=h.high, num=h.num, sum=h.total,
                                             sum_squares=h.total_sq, bucket_limits=list(h.edges[1:]),
                                             bucket_counts=list(h.counts), global_step=step)
                writer.flush()
            else:
                continue
            done.append(backend)
        except Exception as e:  # a tracker problem must not stop training
            _warn(backend, "mask histograms", e)
    return done


#: every character ``str.splitlines`` breaks at (decoded tokens of a small model contain them)
_LINE_BREAK_CHARS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def one_line(text: str) -> str:
    """``text`` with every line-break character (those ``str.splitlines`` splits at) replaced by ``⏎``."""
    return text.translate(str.maketrans(dict.fromkeys(_LINE_BREAK_CHARS, "⏎")))


def _fmt(value, column: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3g}" if column == "p" else f"{value:.4f}"
    return str(value)


def markdown_table(rows: list[dict], *, title: str, columns: tuple[str, ...] = TEXT_COLUMNS) -> str:
    """``title`` then a markdown table of ``rows`` (``columns``; backslash and ``|`` escaped, line breaks → ⏎)."""
    def cells(r):
        return [one_line(_fmt(r[c], c).replace("\\", "\\\\").replace("|", "\\|")) for c in columns]

    lines = [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def top_silenced(rows: list[dict], k: int = TOP_K) -> list[dict]:
    """The ``k`` most frequent silenced tokens among ``rows``: ``{token, token_id, count, p_mean, entropy_mean,
    context}`` (context: the first row's), by count, then by mean p (ascending), then by token id."""
    groups = defaultdict(list)
    for r in rows:
        if r["kind"] == "silenced":
            groups[r["token_id"]].append(r)
    out = [{"token": g[0]["token"], "token_id": tid, "count": len(g), "p_mean": sum(r["p"] for r in g) / len(g),
            "entropy_mean": sum(r["entropy"] for r in g) / len(g), "context": g[0]["context"]}
           for tid, g in groups.items()]
    out.sort(key=lambda t: (-t["count"], t["p_mean"], t["token_id"]))
    return out[:k]


def table_title(rows: list[dict], step: int, rows_selected: int) -> str:
    """One line naming the step, the row counts and the thresholds of a token table."""
    n_sil = sum(r["kind"] == "silenced" for r in rows)
    tau_h = next((r["tau_h"] for r in rows if r["tau_h"] is not None), None)
    tau_p = rows[0]["tau_p"] if rows else math.nan
    modes = "/".join(sorted({f"{r['loss_mode']}, stats_source {r['stats_source']}" for r in rows}))
    return (f"step {step}: token table {TABLE_KEY} with {n_sil} silenced + {len(rows) - n_sil} kept-candidate rows "
            f"(of {rows_selected} selected over DP); tau_p={tau_p:g}"
            + (f", tau_h={tau_h:.4g}" if tau_h is not None else "") + (f"; loss_mode {modes}" if modes else ""))


def summary_lines(rows: list[dict], step: int, rows_selected: int, k: int = TOP_K) -> list[str]:
    """The console / file lines of one table: the title, then one line per top silenced token."""
    lines = [f"[stapo] {table_title(rows, step, rows_selected)}; top {k} silenced tokens:"]
    for i, t in enumerate(top_silenced(rows, k), 1):
        ctx = one_line(t["context"])
        lines.append(f"[stapo]   {i:2d}. {t['token']!r} (id {t['token_id']}) x{t['count']}  p={t['p_mean']:.3g}  "
                     f"H={t['entropy_mean']:.3f}  {ctx}")
    return lines


def log_token_table(tracking, rows: list[dict], step: int, *, rows_selected: int | None = None,
                    k: int = TOP_K) -> list[str]:
    """Write one step's token rows to every backend of ``tracking`` that can hold a table (see the module table).

    Args:
        tracking: verl's ``Tracking``. rows: token rows (schema :data:`SCHEMA`). step: verl's global step.
        rows_selected: rows selected over the DP group before the cap (default ``len(rows)``). k: top-k lines.

    Returns:
        The backends written (none for an empty ``rows``: a step that silenced no token has no table).
    """
    rows_selected = len(rows) if rows_selected is None else rows_selected
    done = []
    if not rows:
        return done
    for backend in list(getattr(tracking, "logger", {})):
        try:
            if backend == "wandb":
                import wandb

                table = wandb.Table(columns=list(SCHEMA), data=[[r[c] for c in SCHEMA] for r in rows])
                tracking.log({TABLE_KEY: table}, step=step, backend=["wandb"])
            elif backend == "tensorboard":
                writer = tracking.logger["tensorboard"].writer
                writer.add_text(TABLE_KEY, markdown_table(rows, title=table_title(rows, step, rows_selected)),
                                global_step=step)
                writer.flush()
            elif backend == "mlflow":
                import mlflow

                mlflow.log_table(data={c: [r[c] for r in rows] for c in SCHEMA},
                                 artifact_file=f"stapo_tokens/step_{step:06d}.json")
            elif backend == "swanlab":
                import swanlab

                table = swanlab.echarts.Table()
                table.add(headers=list(SCHEMA), rows=[[r[c] for c in SCHEMA] for r in rows])
                tracking.log({TABLE_KEY: table}, step=step, backend=["swanlab"])
            elif backend == "clearml":
                import pandas as pd

                tracking.log({TABLE_KEY: pd.DataFrame([[r[c] for c in SCHEMA] for r in rows], columns=list(SCHEMA))},
                             step=step, backend=["clearml"])
            elif backend == "console":
                print("\n".join(summary_lines(rows, step, rows_selected, k)), flush=True)
            elif backend == "file":
                tracking.log({TOP_KEY: summary_lines(rows, step, rows_selected, k)}, step=step, backend=["file"])
            else:
                continue
            done.append(backend)
        except Exception as e:  # a tracker problem must not stop training
            _warn(backend, "token table", e)
    return done
