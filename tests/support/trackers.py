"""Reading what a tiny run wrote to verl's trackers: TensorBoard event files (the token table's text summaries, the
histograms, the scalar charts) checked against the run's metrics and its JSONL token dump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stapo_verl.diagnostics.stats import HISTOGRAMS
from stapo_verl.diagnostics.trackers import TEXT_COLUMNS, one_line


def event_accumulator(run_dir: Path) -> EventAccumulator:
    """The run's TensorBoard events (``<run_dir>/tensorboard``, where the tiny recipe points ``TENSORBOARD_DIR``)."""
    ea = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "histograms": 0, "scalars": 0})
    ea.Reload()
    return ea


def ui_steps(run_dir: Path, *tags: str) -> dict[str, list[int]]:
    """The steps of each tag as TensorBoard's UI shows them (its data provider reads with the plugin event
    accumulator, which drops the events an interrupted invocation wrote at or after the next one's first step)."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as UIAccumulator

    ea = UIAccumulator(str(run_dir / "tensorboard"), tensor_size_guidance={"scalars": 0, "text": 0})
    ea.Reload()
    return {tag: [e.step for e in ea.Tensors(tag)] for tag in tags}


def cells(line: str) -> list[str]:
    """The cells of one markdown table row, unescaped (a backslash escapes the next character)."""
    inner, row, i = line[2:-2], [""], 0  # "| a | b |" → "a | b"
    while i < len(inner):
        if inner[i] == "\\":
            row[-1] += inner[i + 1]
            i += 2
        elif inner.startswith(" | ", i):
            row.append("")
            i += 3
        else:
            row[-1] += inner[i]
            i += 1
    return row


def tables(ea, tau_p: float) -> dict[int, list[dict]]:
    """TensorBoard text summaries of the token table → {step: rows} (cells as strings)."""
    out = {}
    for ev in ea.Tensors("actor/stapo/tokens/text_summary"):
        lines = ev.tensor_proto.string_val[0].decode().splitlines()
        assert lines[0].startswith(f"step {ev.step}: token table") and f"tau_p={tau_p}" in lines[0], lines[0]
        assert lines[2] == "| " + " | ".join(TEXT_COLUMNS) + " |", lines[:3]
        out[ev.step] = [dict(zip(TEXT_COLUMNS, cells(line), strict=True)) for line in lines[4:]]
    return out


def dump_rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for f in sorted(run_dir.glob("stapo_tokens.dp*.jsonl")) for x in f.read_text().splitlines()]


def check_tensorboard(run: dict, steps: int, tau_p: float) -> dict:
    m, ea = run["metrics"], run["tb"]
    assert sorted(m) == list(range(1, steps + 1))
    # conditioned on what the metrics report: which steps have candidates and silence tokens is a property of the
    # trajectory, and the seeded warm start (so the trajectory) differs by CPU type
    with_candidates = {s for s in m if m[s]["actor/stapo/num_candidates"] > 0}
    # rows are the silenced tokens plus as many kept candidates (select_rows), so with dump_every=1 a step has a
    # table exactly when it silenced a token; a step whose candidates all stayed above tau_h has none
    with_silenced = {s for s in m if m[s]["actor/stapo/num_masked"] > 0}
    found = tables(ea, tau_p)
    ui = ui_steps(run["dir"], "actor/stapo/tokens/text_summary", "actor/pg_loss")
    table_steps, chart_steps = ui["actor/stapo/tokens/text_summary"], ui["actor/pg_loss"]
    assert len(table_steps) == len(set(table_steps)), f"a step's table twice: {table_steps}"
    assert chart_steps == sorted(m), f"steps of actor/pg_loss in TensorBoard: {chart_steps}"
    assert set(found) == with_silenced, (sorted(found), sorted(with_silenced), sorted(with_candidates))
    dump = dump_rows(run["dir"])
    key = lambda step, r: (step, *(int(r[c]) for c in ("minibatch", "dp_rank", "sample_index", "position")))  # noqa: E731
    dumped = {key(r["step"], r): r for r in dump}
    for step, rows in found.items():
        n_sil = sum(r["kind"] == "silenced" for r in rows)
        assert n_sil == m[step]["actor/stapo/num_masked"]  # one mini-batch a step, below every cap
        for r in rows:  # each table row is a row of the complete record (the JSONL dump), same token and kind
            d = dumped[key(step, r)]
            assert (r["token_id"], r["kind"], r["context"]) == (str(d["token_id"]), d["kind"],
                                                                one_line(d["context"]))
    for name in HISTOGRAMS:
        hists = {e.step: e.histogram_value for e in ea.Histograms(f"actor/stapo/hist/{name}")}
        if name.endswith("_pos"):
            assert {s: int(h.num) for s, h in hists.items()} == {
                s: int(m[s]["actor/stapo/num_candidates"]) for s in with_candidates}
    for s in with_candidates:  # scalar charts; with entropy_quantile 0.75 the candidates' p75 is τ_h
        assert m[s]["actor/stapo/candidate_entropy_p75"] == pytest.approx(m[s]["actor/stapo/tau_h"])
        assert 0 < m[s]["actor/stapo/pos_adv_below_tau_p_frac"] <= 1
        assert [e.value for e in ea.Scalars("actor/stapo/candidate_entropy_p95") if e.step == s] == [
            pytest.approx(m[s]["actor/stapo/candidate_entropy_p95"])]
    for s in m:  # the LM-head gradient norm: every step, part of the total
        assert 0 < m[s]["actor/stapo/lm_head_grad_norm"] <= m[s]["actor/grad_norm"]
    return found
