"""End to end: what the tiny run writes to verl's trackers — TensorBoard event files (FSDP and Megatron TP=2) and the
wandb offline run directory (FSDP) — read back with TensorBoard's reader and as wandb's table JSON.

One short run per engine, several assertions each. The trackers are switched on with Hydra overrides
(``trainer.logger``, the ``TENSORBOARD_DIR`` / ``WANDB_MODE=offline`` / ``WANDB_DIR`` of the Ray runtime env, which
the TaskRunner that owns verl's ``Tracking`` reads), ``policy_loss.dump_every=1`` (a table every step) and a collapse
threshold low enough that the early-warning fires once its 2-step warm-up is over.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.runs import SMALL, failure_text, metrics_by_step, run_recipe
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stapo_verl.diagnostics.stats import HISTOGRAMS
from stapo_verl.diagnostics.trackers import TEXT_COLUMNS
from stapo_verl.minibatch.token_dump import SCHEMA

PL = "actor_rollout_ref.actor.policy_loss"
ENV = "ray_kwargs.ray_init.runtime_env.env_vars"


def _run(tmp_path_factory, name, steps, loggers, engine, timeout):
    run_dir = tmp_path_factory.mktemp(name) / "run"
    tb = run_dir / "tensorboard"
    overrides = [*SMALL, f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.save_freq=-1",
                 f"trainer.logger=[{','.join(loggers)}]", f"+{ENV}.TENSORBOARD_DIR='{tb}'",
                 f"{PL}.dump_every=1", f"{PL}.collapse_warmup_steps=2", f"{PL}.collapse_z_threshold=0.001"]
    if "wandb" in loggers:
        overrides += [f"++{ENV}.WANDB_MODE=offline", f"+{ENV}.WANDB_DIR='{run_dir}'"]
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *overrides, timeout=timeout, ENGINE=engine)
    assert r.returncode == 0, failure_text(run_dir, r)
    ea = EventAccumulator(str(tb), size_guidance={"tensors": 0, "histograms": 0, "scalars": 0})
    ea.Reload()
    return {"dir": run_dir, "proc": r, "tb": ea, "metrics": metrics_by_step(run_dir / "metrics.jsonl")}


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    return _run(tmp_path_factory, "fsdp", 3, ["console", "file", "tensorboard", "wandb"], "fsdp", 720)


@pytest.fixture(scope="module")
def megatron(tmp_path_factory):
    return _run(tmp_path_factory, "megatron", 2, ["console", "file", "tensorboard"], "megatron", 900)


def _cells(line: str) -> list[str]:
    """The cells of one markdown table row, unescaped (a backslash escapes the next character)."""
    inner, cells, i = line[2:-2], [""], 0  # "| a | b |" → "a | b"
    while i < len(inner):
        if inner[i] == "\\":
            cells[-1] += inner[i + 1]
            i += 2
        elif inner.startswith(" | ", i):
            cells.append("")
            i += 3
        else:
            cells[-1] += inner[i]
            i += 1
    return cells


def _tables(ea) -> dict[int, list[dict]]:
    """TensorBoard text summaries of the token table → {step: rows} (cells as strings)."""
    out = {}
    for ev in ea.Tensors("actor/stapo/tokens/text_summary"):
        lines = ev.tensor_proto.string_val[0].decode().splitlines()
        assert lines[0].startswith(f"step {ev.step}: token table") and "tau_p=0.1" in lines[0], lines[0]
        assert lines[2] == "| " + " | ".join(TEXT_COLUMNS) + " |", lines[:3]
        out[ev.step] = [dict(zip(TEXT_COLUMNS, _cells(line), strict=True)) for line in lines[4:]]
    return out


def _dump(run_dir: Path) -> list[dict]:
    return [json.loads(x) for f in sorted(run_dir.glob("stapo_tokens.dp*.jsonl")) for x in f.read_text().splitlines()]


def _check_tensorboard(run, steps):
    m, ea = run["metrics"], run["tb"]
    assert sorted(m) == list(range(1, steps + 1))
    with_candidates = {s for s in m if m[s]["actor/stapo/num_candidates"] > 0}
    assert with_candidates, "no step had candidates: nothing to check"
    tables = _tables(ea)
    assert set(tables) == with_candidates  # dump_every=1: a table at every step that had rows
    dump = _dump(run["dir"])
    key = lambda step, r: (step, *(int(r[c]) for c in ("minibatch", "dp_rank", "sample_index", "position")))  # noqa: E731
    dumped = {key(r["step"], r): r for r in dump}
    for step, rows in tables.items():
        n_sil = sum(r["kind"] == "silenced" for r in rows)
        assert n_sil == m[step]["actor/stapo/num_masked"]  # one mini-batch a step, below every cap
        for r in rows:  # each table row is a row of the complete record (the JSONL dump), same token and kind
            d = dumped[key(step, r)]
            assert (r["token_id"], r["kind"], r["context"]) == (str(d["token_id"]), d["kind"],
                                                                d["context"].replace("\n", "⏎"))
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
    return tables


def test_fsdp_tensorboard_holds_tables_histograms_and_charts(fsdp):
    _check_tensorboard(fsdp, 3)


def test_fsdp_wandb_offline_run_holds_the_same_table(fsdp):
    tables = _tables(fsdp["tb"])
    (run,) = (fsdp["dir"] / "wandb").glob("offline-run-*")
    files = sorted((run / "files" / "media" / "table" / "actor" / "stapo").glob("tokens_*.table.json"))
    by_step = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in files}
    assert set(by_step) == set(tables)
    for step, t in by_step.items():
        assert t["columns"] == list(SCHEMA)
        assert [str(r[SCHEMA.index("token_id")]) for r in t["data"]] == [r["token_id"] for r in tables[step]]
        assert [r[SCHEMA.index("kind")] for r in t["data"]] == [r["kind"] for r in tables[step]]


def test_fsdp_console_has_top_tokens_and_the_early_warning(fsdp):
    out = fsdp["proc"].stdout + (fsdp["dir"] / "train.log").read_text(errors="replace")
    m = fsdp["metrics"]
    # z-scores from step 3 (2 earlier values); the 0.001 threshold makes any change a warning
    assert "actor/stapo/collapse/entropy_z" not in m[2] and "actor/stapo/collapse/entropy_z" in m[3]
    warning = [x for x in out.splitlines() if "[stapo] collapse warning at step 3: actor/entropy = " in x]
    assert warning and "No action taken." in warning[0] and "stapo_tokens.dp*.jsonl" in warning[0]
    steps_with_table = set(_tables(fsdp["tb"]))
    for s in steps_with_table:
        assert f"[stapo] step {s}: token table actor/stapo/tokens with " in out
        assert m[s]["actor/stapo/tokens_top"][0].startswith(f"[stapo] step {s}: token table")  # file logger


def test_megatron_tp2_tensorboard_holds_tables_and_histograms(megatron):
    assert megatron["metrics"][1]["actor/stapo/lm_head_grad_norm"] > 0  # distributed optimizer at DP=1: readable
    _check_tensorboard(megatron, 2)
