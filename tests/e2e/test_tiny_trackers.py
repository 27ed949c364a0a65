"""End to end: what the tiny run writes to verl's trackers — TensorBoard event files and the wandb offline run
directory — read back with TensorBoard's reader and as wandb's table JSON (FSDP; the Megatron TP=2 run's TensorBoard
files are checked in ``test_tiny_stapo_megatron.py``).

One short run, several assertions. ``LOGGER=[console,file,tensorboard,wandb]`` with ``WANDB_MODE=offline`` makes the
tiny recipe log to TensorBoard in ``<run dir>/tensorboard`` and to wandb in ``<run dir>/wandb`` (it sets
``TENSORBOARD_DIR`` / ``WANDB_MODE`` / ``WANDB_DIR`` in the Ray runtime env, read by the TaskRunner that owns verl's
``Tracking``); ``policy_loss.dump_every=1`` logs a table every step, and a collapse threshold this low makes the
early-warning fire once its 2-step warm-up is over.
"""

from __future__ import annotations

import json

import pytest
from support.runs import SMALL, failure_text, metrics_by_step, run_recipe
from support.trackers import check_tensorboard, event_accumulator, tables

from stapo_verl.minibatch.dump_schema import SCHEMA

PL = "actor_rollout_ref.actor.policy_loss"


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("fsdp") / "run"
    overrides = [*SMALL, "trainer.total_training_steps=3", "trainer.test_freq=-1", "trainer.save_freq=-1",
                 f"{PL}.dump_every=1", f"{PL}.collapse_warmup_steps=2", f"{PL}.collapse_z_threshold=0.001"]
    # the test session sets WANDB_MODE=disabled (tests/conftest.py); the recipe keeps a WANDB_MODE it is given
    r = run_recipe("tiny_cpu_stapo.sh", run_dir, *overrides, timeout=720, LOGGER="[console,file,tensorboard,wandb]",
                   WANDB_MODE="offline")
    assert r.returncode == 0, failure_text(run_dir, r)
    return {"dir": run_dir, "proc": r, "tb": event_accumulator(run_dir),
            "metrics": metrics_by_step(run_dir / "metrics.jsonl")}


def test_fsdp_tensorboard_holds_tables_histograms_and_charts(fsdp):
    check_tensorboard(fsdp, 3, tau_p=0.1)


def test_fsdp_wandb_offline_run_holds_the_same_table(fsdp):
    found = tables(fsdp["tb"], tau_p=0.1)
    (run,) = (fsdp["dir"] / "wandb").glob("offline-run-*")
    files = sorted((run / "files" / "media" / "table" / "actor" / "stapo").glob("tokens_*.table.json"))
    by_step = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in files}
    assert set(by_step) == set(found)
    for step, t in by_step.items():
        assert t["columns"] == list(SCHEMA)
        assert [str(r[SCHEMA.index("token_id")]) for r in t["data"]] == [r["token_id"] for r in found[step]]
        assert [r[SCHEMA.index("kind")] for r in t["data"]] == [r["kind"] for r in found[step]]


def test_fsdp_console_has_top_tokens_and_the_early_warning(fsdp):
    out = fsdp["proc"].stdout + (fsdp["dir"] / "train.log").read_text(errors="replace")
    m = fsdp["metrics"]
    # z-scores from step 3 (2 earlier values); the 0.001 threshold makes any change a warning
    assert "actor/stapo/collapse/entropy_z" not in m[2] and "actor/stapo/collapse/entropy_z" in m[3]
    warning = [x for x in out.splitlines() if "[stapo] collapse warning at step 3: actor/entropy = " in x]
    assert warning and "No action taken." in warning[0] and "stapo_tokens.dp*.jsonl" in warning[0]
    steps_with_table = set(tables(fsdp["tb"], tau_p=0.1))
    for s in steps_with_table:
        assert f"[stapo] step {s}: token table actor/stapo/tokens with " in out
        assert m[s]["actor/stapo/tokens_top"][0].startswith(f"[stapo] step {s}: token table")  # file logger
