"""stapo_verl.plots on real files of a tiny run (tests/data/tiny_run, see its README) and on hand-built dumps.

Expected numbers are recomputed here from the raw fixture lines with plain ``json`` (never with the module
under test), so a wrong key, step filter, grouping or formula fails.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from stapo_verl.plots.__main__ import main
from stapo_verl.plots.loading import RunFileError, read_metrics, read_tokens
from stapo_verl.plots.overlay import overlay
from stapo_verl.plots.report import summarize, token_summary, write_report
from support.procs import TESTS

FIXTURE = TESTS / "data" / "tiny_run"
VAL_KEY = "val-core/math_dapo/acc/mean@4"


def _raw(path: Path) -> dict[int, dict]:
    """The fixture's metrics, merged per step, straight from the JSONL lines."""
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], {}).update(rec["data"])
    return out


@pytest.fixture()
def run(tmp_path) -> Path:
    d = tmp_path / "tiny_run"
    shutil.copytree(FIXTURE, d, ignore=shutil.ignore_patterns("README.md"))
    return d


def _row(**kw) -> dict:
    base = dict(step=1, minibatch=0, dp_rank=0, sample_index=0, position=3, token_id=5, token="7",
                context="a b ⟦7⟧ c", p=0.01, entropy=0.2, advantage=0.5, tau_h=0.4, tau_p=0.1, kind="silenced",
                loss_mode="stapo", stats_source="old_policy")
    base.update(kw)
    return base


def _write_rows(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def test_summary_of_the_real_run_recomputed_by_hand(run):
    raw = _raw(run / "metrics.jsonl")
    train = sorted(s for s, d in raw.items() if "actor/pg_loss" in d)
    assert train == [1, 2, 3]  # the fixture: 3 training steps, validation at 0 and 3
    rep = write_report(run)
    s = rep.summary
    assert (s["steps"], s["first_step"], s["last_step"]) == (3, 1, 3)

    v = s["validation"]["math_dapo"]
    assert v["key"] == VAL_KEY
    assert v["start"]["step"] == 0 and v["end"]["step"] == 3
    assert v["start"]["value"] == raw[0][VAL_KEY] and v["end"]["value"] == raw[3][VAL_KEY]
    # standard error over prompts from verl's validation dump, by hand
    for point in (v["start"], v["end"]):
        rows = [json.loads(x) for x in (run / "val_generations" / f"{point['step']}.jsonl").read_text().splitlines()]
        per_prompt: dict[str, list[float]] = {}
        for r in rows:
            if r["data_source"] == "math_dapo":
                per_prompt.setdefault(r["input"], []).append(float(r["acc"]))
        means = [sum(x) / len(x) for x in per_prompt.values()]
        assert point["n_prompts"] == len(means) == 640
        assert point["se"] == pytest.approx(statistics.stdev(means) / math.sqrt(len(means)), rel=1e-12)
        # parity with verl: the mean of the per-prompt means is the accuracy verl logged
        assert point["dump_mean"] == pytest.approx(point["value"], abs=1e-12)
    assert v["delta"] == pytest.approx(raw[3][VAL_KEY] - raw[0][VAL_KEY])
    assert 0 < v["delta_se"] < 1

    reward = [raw[t]["critic/score/mean"] for t in train]
    assert (s["reward"]["first"], s["reward"]["last"]) == (reward[0], reward[-1])
    assert s["reward"]["mean"] == pytest.approx(sum(reward) / 3)
    assert s["num_masked_logged_sum"] == sum(raw[t]["actor/stapo/num_masked"] for t in train)
    assert s["masked_frac"]["mean"] == pytest.approx(sum(raw[t]["actor/stapo/masked_frac"] for t in train) / 3)

    md = (run / "summary.md").read_text()
    assert f"{raw[0][VAL_KEY]:.3f} ± {v['start']['se']:.3f} (n = 640 prompts) @ step 0" in md
    assert "training steps run: 3 (steps 1–3)" in md
    assert json.loads((run / "summary.json").read_text())["validation"]["math_dapo"]["end"]["se"] == v["end"]["se"]


def test_curves_figure_draws_the_logged_values(run):
    raw = _raw(run / "metrics.jsonl")
    rep = write_report(run)
    axes = rep.curves.axes
    assert [a.get_title() for a in axes] == [
        "entropy (actor/entropy)", "validation accuracy (val-core/<source>/acc/mean@N)",
        "mean reward (critic/score/mean)", "masked fraction (actor/stapo/masked_frac)"]
    ent = axes[0].get_lines()[0]
    assert list(ent.get_xdata()) == [1, 2, 3]
    assert list(ent.get_ydata()) == [raw[s]["actor/entropy"] for s in (1, 2, 3)]
    val_lines = {ln.get_label(): ln for ln in axes[1].get_lines() if not ln.get_label().startswith("_")}
    assert set(val_lines) == {"tiny_run: gsm8k", "tiny_run: math500", "tiny_run: math_dapo"}
    assert list(val_lines["tiny_run: math_dapo"].get_ydata()) == [raw[0][VAL_KEY], raw[3][VAL_KEY]]
    # ±1 SE error bars: the math_dapo bars are centred on the logged accuracy, half-length = the summary's SE
    se = rep.summary["validation"]["math_dapo"]["se_by_step"]
    bars = {(float(seg[0][0]), round(float(seg[:, 1].mean()), 12)): float(seg[1][1] - seg[0][1]) / 2
            for c in axes[1].containers for seg in c.lines[2][0].get_segments()}
    for step in (0, 3):
        assert bars[(step, round(raw[step][VAL_KEY], 12))] == pytest.approx(se[step])
    img = mpimg.imread(run / "plot.png")
    assert img.shape[:2] == (770, 1100)  # figsize (10, 7) at 110 dpi


def test_missing_dump_is_said_plainly(run):
    (run / "stapo_tokens.dp0.jsonl").unlink()
    rep = write_report(run)
    assert rep.summary["token_dump"]["files"] == []
    md = (run / "summary.md").read_text()
    assert "no token dump found" in md
    ax = rep.scatter.axes[0]
    assert ax.get_xscale() == "log" and not ax.collections
    assert any("no token dump found" in t.get_text() for t in ax.texts)
    assert mpimg.imread(run / "scatter.png").ndim == 3


def test_real_dump_agrees_with_logged_counts(run):
    raw = _raw(run / "metrics.jsonl")
    dump = [json.loads(x) for x in (run / "stapo_tokens.dp0.jsonl").read_text().splitlines()]
    rep = write_report(run)
    td = rep.summary["token_dump"]
    for step in (1, 2, 3):
        mine = [r for r in dump if r["step"] == step]
        sil = sum(r["kind"] == "silenced" for r in mine)
        # the cap (256 rows) is not reached here, so the dump holds every silenced token of the step, and every
        # kept candidate since there are fewer of them than silenced ones
        assert sil == raw[step]["actor/stapo/num_masked"]
        assert len(mine) - sil == raw[step]["actor/stapo/num_candidates"] - raw[step]["actor/stapo/num_masked"]
    # the fixture obeys S2T's rule (candidates: Â > 0, p < τ_p; silenced iff H < τ_h, strict, ties kept)
    assert all(r["advantage"] > 0 and r["p"] < r["tau_p"] and (r["entropy"] < r["tau_h"]) == (r["kind"] == "silenced")
               for r in dump)
    assert (td["rows"], td["silenced"], td["kept"], td["excluded_other_steps"]) == (24, 17, 7, 0)
    assert td["silenced"] == rep.summary["num_masked_logged_sum"]
    top = td["top_silenced"][0]
    sevens = [r for r in dump if r["kind"] == "silenced" and r["token_id"] == 25]
    assert (top["token_id"], top["token"], top["count"]) == (25, "7", 2) == (25, sevens[0]["token"], len(sevens))
    assert top["share"] == 2 / 17 and top["contexts"] == [r["context"] for r in sevens]
    assert top["mean_p"] == pytest.approx(sum(r["p"] for r in sevens) / 2)
    assert td["loss_modes"] == ["stapo"] and td["stats_sources"] == ["old_policy"]
    md = (run / "summary.md").read_text()
    assert '| 1 | "7" | 25 | 2 | 11.8% |' in md and "(17 silenced, 7 kept candidates" in md
    ax = rep.scatter.axes[0]
    assert ax.get_xscale() == "log"
    kept, silenced = ax.collections[:2]
    assert len(silenced.get_offsets()) == 17 and len(kept.get_offsets()) == 7
    assert sorted(silenced.get_offsets()[:, 1]) == pytest.approx(sorted(r["entropy"] for r in dump
                                                                        if r["kind"] == "silenced"))
    assert [ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_label().startswith("τ_p")] == [0.1]
    taus = {(r["step"], r["minibatch"]): r["tau_h"] for r in dump}
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("τ_h")] == [
        statistics.median(taus.values())]
    assert mpimg.imread(run / "scatter.png").ndim == 3


def test_dump_search_step_filter_and_ties(run):
    (run / "stapo_tokens.dp0.jsonl").unlink()
    # hand-built rows at the fixture's training steps 1..3 in two files (a subdirectory is searched too), plus
    # rows of step 9 from "another invocation" appended to the same file, which must be excluded
    rows = ([_row(step=1, token_id=5, token="7", p=0.02, entropy=0.1, context=f"x ⟦7⟧ {i}") for i in range(3)]
            + [_row(step=2, token_id=9, token=" +", p=0.04, entropy=0.3, minibatch=0, tau_h=0.5)]
            + [_row(step=2, kind="kept", token_id=11, p=0.0, entropy=0.9, tau_h=0.5)] * 4
            + [_row(step=9, token_id=9, token=" +")] * 10)
    _write_rows(run / "stapo_tokens" / "stapo_tokens.dp0.jsonl", rows[:5])
    _write_rows(run / "stapo_tokens.dp1.jsonl", rows[5:])
    rep = write_report(run)
    td = rep.summary["token_dump"]
    assert (td["rows"], td["silenced"], td["kept"], td["excluded_other_steps"]) == (8, 4, 4, 10)
    assert [(t["token_id"], t["count"]) for t in td["top_silenced"]] == [(5, 3), (9, 1)]
    top = td["top_silenced"][0]
    assert top["share"] == 0.75 and top["contexts"] == ["x ⟦7⟧ 0", "x ⟦7⟧ 1"]
    ax = rep.scatter.axes[0]
    kept = ax.collections[0]
    # p = 0 cannot sit on the log axis: drawn a decade below the smallest positive p (0.02)
    assert list(kept.get_offsets()[:, 0]) == pytest.approx([0.002] * 4)
    assert "4 with p=0" in kept.get_label()
    # τ_h: one value per (step, minibatch): 0.4 (step 1) and 0.5 (step 2) → median 0.45
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("τ_h")] == [0.45]


def test_malformed_dump_line_names_file_and_line(tmp_path):
    f = tmp_path / "stapo_tokens.dp0.jsonl"
    f.write_text(json.dumps(_row()) + "\n\n" + "{not json\n")
    with pytest.raises(RunFileError, match=rf"{f}:3: malformed JSON line"):
        read_tokens([f])
    bad = _row()
    del bad["tau_p"]
    _write_rows(f, [_row(), bad])
    with pytest.raises(RunFileError, match=rf"{f}:2: missing key\(s\) \['tau_p'\]"):
        read_tokens([f])
    _write_rows(f, [_row(kind="masked")])
    with pytest.raises(RunFileError, match="key 'kind' = 'masked'; allowed: \\['silenced', 'kept'\\]"):
        read_tokens([f])
    _write_rows(f, [_row(p=True)])
    with pytest.raises(RunFileError, match="key 'p' = True has type bool"):
        read_tokens([f])


def test_report_covers_only_this_invocation(run):
    # an earlier run in the same run dir, started afresh (the recipe renames it metrics.<ts>.jsonl): 20 other steps
    old = "".join(json.dumps({"step": s, "data": {"actor/pg_loss": 0.0, "critic/score/mean": 1.0,
                                                  "actor/stapo/num_masked": 100.0}}) + "\n" for s in range(4, 24))
    (run / "metrics.1700000000.jsonl").write_text(old)
    s, _ = summarize(run)
    assert s["steps"] == 3 and s["reward"]["last"] != 1.0
    assert s["other_metrics_files"] == [str(run / "metrics.1700000000.jsonl")]
    # a second invocation that found the run complete: verl logs only its validation at the resumed step
    (run / "metrics.jsonl").write_text(json.dumps({"step": 3, "data": {VAL_KEY: 0.5}}) + "\n")
    s, _ = summarize(run)
    assert s["steps"] == 0 and s["reward"] is None
    write_report(run)
    assert "training steps run: 0" in (run / "summary.md").read_text()
    # --metrics picks another file explicitly
    s, _ = summarize(run, metrics_file=run / "metrics.1700000000.jsonl")
    assert (s["steps"], s["first_step"], s["last_step"]) == (20, 4, 23)


def test_se_needs_attributable_rows(run):
    # verl's dump lacks data_source unless the reward function returns it; with 3 sources nothing is guessed
    for f in (run / "val_generations").glob("*.jsonl"):
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        _write_rows(f, [{k: v for k, v in r.items() if k != "data_source"} for r in rows])
    v = summarize(run)[0]["validation"]["math_dapo"]
    assert v["start"]["se"] is None and v["delta_se"] is None
    assert "no data_source" in v["se_note"] and "3 sources" in v["se_note"]
    shutil.rmtree(run / "val_generations")
    v = summarize(run)[0]["validation"]["math_dapo"]
    assert v["start"]["se"] is None and "trainer.validation_data_dir" in v["se_note"]


def test_overlay_two_runs(run, tmp_path):
    other = tmp_path / "grpo"
    other.mkdir()
    raw = _raw(run / "metrics.jsonl")
    # a second real-format run: the same file with the STAPO metrics dropped, as verl's vanilla loss logs it
    (other / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "data": {k: v for k, v in d.items() if not k.startswith("actor/stapo/")}}) + "\n"
        for s, d in sorted(raw.items())))
    fig = overlay([run, other], tmp_path / "o" / "overlay.png", labels=["STAPO", "GRPO"])
    ent, val, rew, masked = fig.axes
    assert [ln.get_label() for ln in ent.get_lines()] == ["STAPO", "GRPO"]
    assert [ln.get_label() for ln in masked.get_lines()] == ["STAPO"]  # GRPO logs no masked fraction
    assert len([ln for ln in val.get_lines() if not ln.get_label().startswith("_")]) == 6  # 3 sources x 2 runs
    assert len(val.containers) == 3  # error bars only for the run with a validation dump (3 sources)
    assert mpimg.imread(tmp_path / "o" / "overlay.png").shape[:2] == (770, 1100)
    with pytest.raises(ValueError, match="--labels has 1 entries for 2 runs"):
        overlay([run, other], tmp_path / "x.png", labels=["A"])
    with pytest.raises(ValueError, match=r"label\(s\) \['A'\] repeated"):
        overlay([run, other], tmp_path / "x.png", labels=["A", "A"])


def test_cli(run, tmp_path, capsys):
    assert main(["report", "--run", str(run), "--wall-seconds", "12.5"]) == 0
    assert "- wall time: 12.5 s" in capsys.readouterr().out
    for name in ("plot.png", "scatter.png", "summary.json", "summary.md"):
        assert (run / name).stat().st_size > 0
    (run / "metrics.jsonl").write_text('{"step": 1, "data": {}}\n{"step": "x"}\n')
    assert main(["report", "--run", str(run)]) == 2
    assert f"{run / 'metrics.jsonl'}:2: expected" in capsys.readouterr().err
    (run / "metrics.jsonl").unlink()
    assert main(["report", "--run", str(run)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err
    # the module entry point the recipes call
    r = subprocess.run([sys.executable, "-m", "stapo_verl.plots", "overlay", "--runs", str(FIXTURE), "--out",
                        str(tmp_path / "cli.png")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert read_metrics(FIXTURE / "metrics.jsonl") and (tmp_path / "cli.png").stat().st_size > 0


def test_token_summary_ties_break_by_id():
    rows = [_row(token_id=8), _row(token_id=3), _row(token_id=8), _row(token_id=3), _row(token_id=1)]
    top = token_summary(rows, {1})["top_silenced"]
    assert [(t["token_id"], t["count"]) for t in top] == [(3, 2), (8, 2), (1, 1)]
