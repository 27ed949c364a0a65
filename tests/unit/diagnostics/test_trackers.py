"""Token tables and histograms through verl's real ``Tracking`` (``stapo_verl.diagnostics.trackers``).

TensorBoard, console and ``file`` are verl's own adapters writing real files, read back here (TensorBoard's event
files with TensorBoard's reader). wandb, MLflow, SwanLab and ClearML are recorders put where verl's ``Tracking``
keeps those backends, checking the objects handed to them (the wandb offline run directory of a real run is read in
``tests/e2e/test_tiny_stapo.py``).
"""

import json
import sys
import types

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stapo_verl.diagnostics import trackers
from stapo_verl.diagnostics.stats import Histogram
from stapo_verl.minibatch.dump_schema import SCHEMA


def _row(kind, token_id, p, h, step=7, pos=3):
    return {"step": step, "minibatch": 1, "dp_rank": 0, "sample_index": 2, "position": pos, "token_id": token_id,
            "token": f"t{token_id}", "context": f"a b ⟦t{token_id}⟧ c|d", "p": p, "entropy": h, "advantage": 1.5,
            "tau_h": 0.8, "tau_p": 0.002, "kind": kind, "loss_mode": "stapo", "stats_source": "old_policy"}


ROWS = [_row("silenced", 5, 1e-4, 0.2), _row("silenced", 9, 3e-4, 0.3), _row("silenced", 5, 2e-4, 0.4),
        _row("kept", 11, 1e-3, 1.2), _row("kept", 12, 5e-4, 0.9)]


class Recorder:
    """Stands where verl's ``Tracking`` keeps a backend: records ``log(data=, step=)``."""

    def __init__(self):
        self.calls = []

    def log(self, data, step):
        self.calls.append((step, data))


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    from verl.utils.tracking import Tracking

    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "metrics.jsonl"))
    t = Tracking("proj", "exp", default_backend=["tensorboard", "console", "file"])
    backends = t.logger
    yield t
    t.logger = backends  # tests swap in recorders; verl's finish() closes the real ones
    t.finish()


def test_tensorboard_holds_the_table_text_and_the_histograms(tracking, tmp_path, capsys):
    hist = Histogram.of(torch.tensor([0.1, 0.2, 2.9, 7.0]), (0.0, 1.0, 2.0, 3.0))
    assert trackers.log_histograms(tracking, {"entropy_adv_pos": hist}, 7) == ["tensorboard"]
    done = trackers.log_token_table(tracking, ROWS, 7, rows_selected=9)
    assert done == ["tensorboard", "console", "file"]
    tracking.finish()
    ea = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0, "histograms": 0})
    ea.Reload()
    (text,) = ea.Tensors("actor/stapo/tokens/text_summary")
    md = text.tensor_proto.string_val[0].decode()
    assert text.step == 7
    assert md.startswith("step 7: token table actor/stapo/tokens with 3 silenced + 2 kept-candidate rows (of 9 "
                         "selected over DP); tau_p=0.002, tau_h=0.8")
    lines = md.splitlines()
    assert md.splitlines()[0].endswith("; loss_mode stapo, stats_source old_policy")
    assert lines[2] == "| " + " | ".join(trackers.TEXT_COLUMNS) + " |" and len(lines) == 4 + len(ROWS)
    # the context's "|" is escaped; constant columns (step, tau_p, loss_mode, stats_source) are in the title
    assert lines[4] == "| silenced | t5 | a b ⟦t5⟧ c\\|d | 0.0001 | 0.2000 | 1.5000 | 0.8000 | 1 | 0 | 2 | 3 | 5 |"
    (h,) = ea.Histograms("actor/stapo/hist/entropy_adv_pos")
    hv = h.histogram_value
    assert h.step == 7 and (hv.num, hv.min, hv.max) == (4, pytest.approx(0.1), 7.0)
    assert list(hv.bucket) == [2, 0, 2] and list(hv.bucket_limit) == [1.0, 2.0, 3.0]
    assert hv.sum == pytest.approx(10.2) and hv.sum_squares == pytest.approx(0.01 + 0.04 + 8.41 + 49)
    # console: the top-k silenced tokens, most frequent first
    out = capsys.readouterr().out.splitlines()
    i = out.index(next(x for x in out if x.startswith("[stapo] step 7: token table")))
    assert out[i + 1].startswith("[stapo]    1. 't5' (id 5) x2  p=0.00015  H=0.300")
    assert out[i + 2].startswith("[stapo]    2. 't9' (id 9) x1")
    # file: the same lines in verl's metrics JSONL
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert recs == [{"step": 7, "data": {trackers.TOP_KEY: out[i:i + 3]}}]


def test_wandb_gets_a_table_and_histograms_through_tracking(tracking):
    import wandb

    rec = Recorder()
    tracking.logger = {"wandb": rec}
    trackers.log_token_table(tracking, ROWS, 3)
    trackers.log_histograms(tracking, {"log10_p_adv_neg": Histogram.of(torch.tensor([-3.5, -3.1]),
                                                                       (-4.0, -3.0, -2.0))}, 3)
    (s1, d1), (s2, d2) = rec.calls
    table = d1[trackers.TABLE_KEY]
    assert s1 == 3 and isinstance(table, wandb.Table) and table.columns == list(SCHEMA)
    assert [r[table.columns.index("token")] for r in table.data] == ["t5", "t9", "t5", "t11", "t12"]
    hist = d2["actor/stapo/hist/log10_p_adv_neg"]
    assert s2 == 3 and isinstance(hist, wandb.Histogram)
    assert hist.histogram == [2, 0] and np.allclose(hist.bins, [-4.0, -3.0, -2.0])


def test_mlflow_swanlab_clearml_get_their_table_objects(tracking, monkeypatch):
    import pandas as pd

    logged = []
    monkeypatch.setitem(sys.modules, "mlflow", types.SimpleNamespace(
        log_table=lambda data, artifact_file: logged.append((data, artifact_file))))

    class EchartsTable:
        def add(self, headers, rows):
            self.headers, self.rows = headers, rows

    swanlab = types.SimpleNamespace(echarts=types.SimpleNamespace(Table=EchartsTable))
    monkeypatch.setitem(sys.modules, "swanlab", swanlab)
    swan, clear = Recorder(), Recorder()
    tracking.logger = {"mlflow": object(), "swanlab": swan, "clearml": clear, "trackio": Recorder()}
    assert trackers.log_token_table(tracking, ROWS, 12) == ["mlflow", "swanlab", "clearml"]
    (data, path), = logged
    assert path == "stapo_tokens/step_000012.json" and list(data) == list(SCHEMA) and data["token_id"][3] == 11
    assert swan.calls[0][1][trackers.TABLE_KEY].headers == list(SCHEMA)
    frame = clear.calls[0][1][trackers.TABLE_KEY]
    assert isinstance(frame, pd.DataFrame) and frame.shape == (5, len(SCHEMA))


def test_empty_tables_and_failing_backends(tracking, capsys):
    assert trackers.log_token_table(tracking, [], 2) == []

    class Broken:
        def log(self, data, step):
            raise RuntimeError("backend down")

    tracking.logger = {"wandb": Broken(), "console": object()}
    assert trackers.log_token_table(tracking, ROWS, 2) == ["console"]  # training goes on
    assert "[stapo] could not log the token table to wandb: RuntimeError: backend down" in capsys.readouterr().out


def test_every_line_break_in_a_context_stays_inside_its_table_row():
    # decoded tokens of a small model include \r, \x1c, \u2028 ...: str.splitlines (and TensorBoard's markdown) break
    # there, which once split one table row into three
    odd = _row("silenced", 7, 1e-4, 0.2)
    odd["context"] = "x\ry\x1cz\u2028w\nv|u"
    text = trackers.markdown_table([odd, *ROWS], title="t")
    lines = text.splitlines()
    assert len(lines) == 4 + 1 + len(ROWS)
    assert "x⏎y⏎z⏎w⏎v\\|u" in lines[4]
    assert trackers.one_line("a\r\nb\x85c") == "a⏎⏎b⏎c"


def test_tensorboard_session_start_hides_an_interrupted_attempts_steps(tmp_path):
    """Invocation 1 logs steps 1-4 (killed after its step-2 checkpoint); invocation 2 marks step 3 and logs 3-4
    again: what TensorBoard's UI reads shows each step once, with invocation 2's values from step 3 on."""
    import time
    from types import SimpleNamespace

    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    from torch.utils.tensorboard import SummaryWriter

    from stapo_verl.diagnostics.trackers import start_tensorboard_session

    first = SummaryWriter(str(tmp_path))
    # every invocation marks its first step: TensorBoard treats the first marker of a run as its start
    assert start_tensorboard_session(SimpleNamespace(logger={"tensorboard": SimpleNamespace(writer=first)}), 1)
    for step in (1, 2, 3, 4):
        first.add_scalar("actor/pg_loss", float(step), step)
        first.add_text("actor/stapo/tokens", f"attempt 1, step {step}", step)
    first.close()
    time.sleep(1.1)  # event files are named by the second they were opened in
    second = SummaryWriter(str(tmp_path))
    assert start_tensorboard_session(SimpleNamespace(logger={"tensorboard": SimpleNamespace(writer=second)}), 3)
    for step in (3, 4):
        second.add_scalar("actor/pg_loss", 10.0 * step, step)
        second.add_text("actor/stapo/tokens", f"attempt 2, step {step}", step)
    second.close()
    # what TensorBoard's UI reads (its data provider uses the plugin event accumulator)
    ea = EventAccumulator(str(tmp_path), tensor_size_guidance={"scalars": 0, "text": 0})
    ea.Reload()
    scalars = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors("actor/pg_loss")]
    assert scalars == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    texts = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
             for e in ea.Tensors("actor/stapo/tokens/text_summary")]
    assert [t[0] for t in texts] == [1, 2, 3, 4] and texts[2][1] == "attempt 2, step 3"
    assert not start_tensorboard_session(SimpleNamespace(logger={"console": object()}), 3)
