"""The plugin on verl 0.9.1 and the upstream series applied to verl train alike: the same batches through verl's real
``TrainingWorker`` with the plugin installed and through the series' ``TrainingWorker`` (``series_equality_job.py``,
one fresh interpreter per path), on the FSDP2 and the Megatron engines, with both statistics sources, and a caller's
own pre-pass set through ``set_loss_fn`` beside the mask.

Bitwise equal: the mask and its count the engine receives for each of the 4 optimizer mini-batches, every metric the
series returns (the losses, the mask's metrics, the caller's; timings and memory aside), and the log-probs of the
updated weights. The plugin adds its diagnostics (``actor/stapo/...`` statistics) and nothing else.
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.megatron_launch import make_model_dir
from support.procs import child_env, free_port

JOB = Path(__file__).with_name("series_equality_job.py")
#: metrics that measure time or memory, not training
VOLATILE = ("perf/", "mfu", "timing", "actor/stapo/current_forward_s")
CASES = (("fsdp", "old_policy"), ("megatron", "old_policy"), ("fsdp", "current_minibatch"))


def _run(tmp: Path, model_dir: Path, path: str, engine: str, stats_source: str) -> dict:
    out = tmp / f"{engine}.{stats_source}.{path}.json"
    proc = subprocess.run([sys.executable, str(JOB), str(out), "--path", path, "--engine", engine,
                           "--stats-source", stats_source, "--model-dir", str(model_dir)],
                          env=child_env(VERL_PLATFORM="cpu", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series_equality")
    model_dir = make_model_dir(tmp / "model")
    runs = [(path, engine, source) for engine, source in CASES for path in ("plugin", "series")]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the plugin and the series' run of a case side by side
        results = list(pool.map(lambda r: _run(tmp, model_dir, *r), runs))
    return {run: result for run, result in zip(runs, results)}


@pytest.mark.parametrize(("engine", "stats_source"), CASES)
def test_the_plugin_and_the_series_give_the_same_mask_loss_metrics_and_weights(reports, engine, stats_source):
    plugin, series = (reports[(path, engine, stats_source)] for path in ("plugin", "series"))
    assert plugin["engine_saw"] == series["engine_saw"]  # the mask and its count, per mini-batch
    assert plugin["log_probs_after"] == series["log_probs_after"]  # the same weights after 4 optimizer steps
    stable = {k: v for k, v in series["metrics"].items() if not k.startswith(VOLATILE)}
    assert {k: plugin["metrics"][k] for k in stable} == stable
    assert {k for k in plugin["metrics"] if k not in series["metrics"]} <= {
        k for k in plugin["metrics"] if k.startswith("actor/stapo/")}
    assert "actor/pg_loss" in stable and "actor/stapo/num_masked" in stable


@pytest.mark.parametrize(("engine", "stats_source"), CASES)
def test_the_callers_pre_pass_and_the_mask_both_ran_in_train_mode(reports, engine, stats_source):
    for path in ("plugin", "series"):
        report = reports[(path, engine, stats_source)]
        saw = report["engine_saw"]
        assert len(saw) == 4 and all(s["callers_field"] and s["training"] for s in saw)
        assert report["metrics"]["actor/callers_pre_pass"] == [1.0] * 4  # its metric, once per mini-batch
        valid = [sum(map(sum, s["mask"])) for s in saw]
        assert [s["count"] for s in saw] == valid  # the count is the mask's sum (one rank)
        assert sum(report["metrics"]["actor/stapo/num_masked"]) > 0  # the mask silenced tokens
