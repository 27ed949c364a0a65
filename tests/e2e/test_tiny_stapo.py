"""End to end: ``bash recipes/tiny_cpu_stapo.sh`` is reproducible, and a killed run continues as if never killed.

The real ``python -m verl.trainer.main_ppo`` through the recipe: recipes/common/base.sh at size ``tiny`` + the CPU
delta (local Ray, TransferQueue, FSDP2 on gloo, the CPU rollout server with the recipe's stop-token generation
config, the ``dapo`` reward manager with the project's scorer, dynamic batch size, ``loss_mode=stapo`` through the
plugin's actor option, ``rollout.full_determinism=True``). Batch sizes are shrunk by Hydra overrides
(:data:`support.runs.SMALL`); the assets come from the cache (``$STAPO_ASSETS`` or ~/.cache/stapo_verl/tiny).

One command, three ways:

1. **A**: 4 steps on an otherwise idle machine (checkpoints at 2 and 4, validation at 4), logging to every tracker
   (``LOGGER=[console,file,tensorboard,wandb]``, wandb offline in ``<run dir>/wandb``). Its TensorBoard files and
   wandb run directory are read back (tables, histograms, charts; wandb's table JSON) and its console must show the
   collapse early-warning (a threshold this low fires once the 2-step warm-up is over).
2. **B**: the same command while a CPU burner runs, killed with ``kill -9`` (the whole process tree) after its
   step-2 checkpoint, once it has written rows of step 3 (its reward held from then on, so step 4 cannot complete
   first: :data:`HELD_REWARD`); a half-written ``global_step_4`` is left behind, as a kill
   during a save leaves it. Then the same command again (burner still running): it resumes from step 2.
3. The same command once more: the run is complete, nothing runs.

A and B must agree on every metric but time, speed and memory, at every step, one row a step; on the token dump byte
for byte; on the validation generations; B's TensorBoard has each step's chart point and table once. That makes
each assertion on A's values certain, not likely: given the seed, the run is a function of the command.
"""

from __future__ import annotations

import json
import time

import pytest
from support.procs import cpu_burner, kill_tree
from support.runs import (
    GRAD_SHARE_KEYS,
    SMALL,
    check_mask_and_denominator,
    failure_text,
    metrics_by_step,
    recipe_process,
    reproducible,
    run_config,
    run_recipe,
)
from support.trackers import check_tensorboard, event_accumulator, tables

from stapo_verl.minibatch.dump_schema import SCHEMA

PL = "actor_rollout_ref.actor.policy_loss"
#: τ_p = 0.9 makes many tokens of positive-advantage responses candidates (at the recipe's 0.1 this 8 x 4 batch has
#: none at steps 1-2; at 0.9, steps 2-4 silenced 1, 11 and 8 tokens on an AMD EPYC; what the tests assert about them is
#: conditioned on the metrics, since the trajectory differs by CPU type); a 2-step collapse
#: warm-up gives z-scores at steps 3 and 4, which a resume reproduces only with the restored windows; a token table
#: every step
COMMAND = [*SMALL, "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=4", f"{PL}.s2t_tau_p=0.9",
           f"{PL}.collapse_warmup_steps=2", f"{PL}.collapse_z_threshold=0.001", f"{PL}.dump_every=1"]
#: every tracker; the test session sets WANDB_MODE=disabled (tests/conftest.py), the recipe keeps a WANDB_MODE it is
#: given
ENV = {"LOGGER": "[console,file,tensorboard,wandb]", "WANDB_MODE": "offline"}


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _wait_for(predicate, proc, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def _has_step_row(path, step: int) -> bool:
    return path.exists() and any(r.get("step") == step for r in _rows(path) if r)


#: the project's reward function, held (not answering) once checkpoint 2 is complete and step 3's metrics row is
#: written: a run given it stops making progress in step 4 whatever the machine's speed, so a kill or a signal sent
#: after step 3's row always lands between checkpoints 2 and 4 (with the plain reward, step 4 and its checkpoint could
#: complete before it arrives). It scores like the plain one, so the trajectory is the command's.
HELD_REWARD = """
import json, os, time
from stapo_verl.rewards import compute_score as _compute_score
TRACKER, METRICS = {tracker!r}, {metrics!r}

def _held():
    if not (os.path.exists(TRACKER) and open(TRACKER).read().strip() == "2" and os.path.exists(METRICS)):
        return False
    return any(json.loads(x).get("step") == 3 for x in open(METRICS).read().splitlines() if x.strip())

def compute_score(*args, **kwargs):
    while _held():
        time.sleep(0.5)
    return _compute_score(*args, **kwargs)
"""


def _held_reward(run_dir, tmp_path) -> str:
    """The override that gives the run at ``run_dir`` :data:`HELD_REWARD`."""
    path = tmp_path / f"held_reward_{run_dir.name}.py"
    path.write_text(HELD_REWARD.format(tracker=str(run_dir / "ckpt" / "latest_checkpointed_iteration.txt"),
                                       metrics=str(run_dir / "metrics.jsonl")))
    return f"reward.custom_reward_function.path={path}"


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    """Run A: the command on an otherwise idle machine."""
    a_dir = tmp_path_factory.mktemp("tiny_stapo") / "a"
    ra = run_recipe("tiny_cpu_stapo.sh", a_dir, *COMMAND, timeout=900, **ENV)
    assert ra.returncode == 0, failure_text(a_dir, ra)
    return {"dir": a_dir, "proc": ra, "tb": event_accumulator(a_dir), "metrics": metrics_by_step(a_dir / "metrics.jsonl")}


def test_tensorboard_holds_tables_histograms_and_charts(run_a):
    check_tensorboard(run_a, 4, tau_p=0.9)


def test_wandb_offline_run_holds_the_same_table(run_a):
    found = tables(run_a["tb"], tau_p=0.9)
    (run,) = (run_a["dir"] / "wandb").glob("offline-run-*")
    files = sorted((run / "files" / "media" / "table" / "actor" / "stapo").glob("tokens_*.table.json"))
    by_step = {int(f.name.split("_")[1]): json.loads(f.read_text()) for f in files}
    assert set(by_step) == set(found)
    for step, t in by_step.items():
        assert t["columns"] == list(SCHEMA)
        assert [str(r[SCHEMA.index("token_id")]) for r in t["data"]] == [r["token_id"] for r in found[step]]
        assert [r[SCHEMA.index("kind")] for r in t["data"]] == [r["kind"] for r in found[step]]


def test_console_has_the_collapse_early_warning(run_a):
    out = run_a["proc"].stdout + (run_a["dir"] / "train.log").read_text(errors="replace")
    m = run_a["metrics"]
    # z-scores from step 3 (2 earlier values); the 0.001 threshold makes any change a warning
    assert "actor/stapo/collapse/entropy_z" not in m[2] and "actor/stapo/collapse/entropy_z" in m[3]
    warning = [x for x in out.splitlines() if "[stapo] collapse warning at step 3: actor/entropy = " in x]
    assert warning and "No action taken." in warning[0] and "stapo_tokens.dp*.jsonl" in warning[0]


def test_same_command_same_run_under_load_and_after_kill_9(tmp_path, run_a):
    a_dir, b_dir = run_a["dir"], tmp_path / "b"
    ma = run_a["metrics"]
    assert sorted(ma) == [1, 2, 3, 4]
    check_mask_and_denominator(ma)  # the S2T mask ran inside the actor worker
    for step in (1, 2, 3, 4):
        assert -1.0 <= ma[step]["critic/score/min"] <= ma[step]["critic/score/max"] <= 1.0
    assert "actor/stapo/collapse/entropy_z" in ma[3] and "actor/stapo/collapse/entropy_z" not in ma[2]
    assert 0.0 <= ma[4]["val-core/math_dapo/acc/mean@1"] <= 1.0
    cfg = run_config(a_dir)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "stapo"
    assert cfg.actor_rollout_ref.rollout.full_determinism is True
    gen_cfg = json.loads((a_dir / "ckpt" / "generation_config" / "generation_config.json").read_text())
    assert len(gen_cfg["eos_token_id"]) == len(set(gen_cfg["eos_token_id"])) == 2
    assert (a_dir / "ckpt" / "global_step_2" / "stapo_driver_state.json").is_file()

    with cpu_burner():
        proc = recipe_process("tiny_cpu_stapo.sh", b_dir, *COMMAND, _held_reward(b_dir, tmp_path),
                              log=tmp_path / "b1.log", **ENV)
        tracker = b_dir / "ckpt" / "latest_checkpointed_iteration.txt"
        try:
            _wait_for(lambda: tracker.exists() and tracker.read_text().strip() == "2", proc, 900, "checkpoint 2")
            _wait_for(lambda: _has_step_row(b_dir / "metrics.jsonl", 3), proc, 300, "step-3 row")
        finally:
            killed = kill_tree(proc.pid)
        assert len(killed) > 5  # the shell, the launcher, Ray's head processes and workers
        assert tracker.read_text().strip() == "2"  # killed between the checkpoints
        dumped = {r["step"] for r in _rows(b_dir / "stapo_tokens.dp0.jsonl")}  # the driver wrote it at each step
        assert (3 in dumped) == (ma[3]["actor/stapo/num_masked"] > 0)  # step 3's rows, to be replaced, if any
        half = b_dir / "ckpt" / "global_step_4" / "actor"
        half.mkdir(parents=True, exist_ok=True)
        (half / "model_world_size_1_rank_0.pt").write_bytes(b"half-written")  # never loaded

        rb = run_recipe("tiny_cpu_stapo.sh", b_dir, *COMMAND, timeout=900, **ENV)
    assert rb.returncode == 0, failure_text(b_dir, rb)
    assert "(steps 3-4)" in rb.stdout  # resumed from global_step_2

    mb = metrics_by_step(b_dir / "metrics.jsonl")
    assert [r["step"] for r in _rows(b_dir / "metrics.jsonl")] == [1, 2, 3, 4]  # one row a step
    assert reproducible(mb) == reproducible(ma)
    assert (b_dir / "stapo_tokens.dp0.jsonl").read_bytes() == (a_dir / "stapo_tokens.dp0.jsonl").read_bytes()
    val = [sorted(json.dumps({k: v for k, v in r.items() if k != "uid"}, sort_keys=True)
                  for r in _rows(d / "val_generations" / "4.jsonl")) for d in (a_dir, b_dir)]
    assert val[0] == val[1]  # verl names prompts by a random uuid4: the same rows, other uids
    check_tensorboard({"dir": b_dir, "tb": event_accumulator(b_dir), "metrics": mb}, 4, tau_p=0.9)
    tb = event_accumulator(b_dir)
    for key in GRAD_SHARE_KEYS:  # a scalar chart point per step, the value of metrics.jsonl (checked in [0, 1])
        assert [(e.step, e.value) for e in tb.Scalars(key)] == [(s, pytest.approx(mb[s][key])) for s in sorted(mb)]
    assert json.loads((b_dir / "summary.json").read_text())["steps"] == 4

    # the same command again: the checkpoint is at the last step, so nothing runs and nothing is rewritten
    before = {p.name: p.read_bytes() for p in (b_dir / "metrics.jsonl", b_dir / "wall.json", b_dir / "summary.json")}
    r3 = run_recipe("tiny_cpu_stapo.sh", b_dir, *COMMAND, timeout=240, **ENV)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert {name: (b_dir / name).read_bytes() for name in before} == before


def test_sigterm_between_checkpoints_is_a_stop_and_the_same_command_resumes(tmp_path, run_a):
    """What Slurm does at a time limit: SIGTERM to the job's processes (here the recipe's process group) after
    checkpoint 2, during step 4 (held there by :data:`HELD_REWARD`). The job ends within a minute with 143, leaves
    none of its processes, prints where the last complete checkpoint is and that the same command resumes, shows no
    traceback, no shell job note and no failure tail; the same command then trains steps 3-4 to A's metrics."""
    import os
    import signal

    import psutil

    c_dir = tmp_path / "c"
    tracker = c_dir / "ckpt" / "latest_checkpointed_iteration.txt"
    proc = recipe_process("tiny_cpu_stapo.sh", c_dir, *COMMAND, _held_reward(c_dir, tmp_path),
                          log=tmp_path / "c1.log", **ENV)
    try:
        _wait_for(lambda: tracker.exists() and tracker.read_text().strip() == "2", proc, 900, "checkpoint 2")
        _wait_for(lambda: _has_step_row(c_dir / "metrics.jsonl", 3), proc, 300, "step-3 row")
        job = [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        os.killpg(proc.pid, signal.SIGTERM)  # the recipe runs in its own session: its group is its pid
        rc = proc.wait(timeout=60)
        assert rc == 143, (rc, (tmp_path / "c1.log").read_text(errors="replace")[-3000:])
    finally:
        kill_tree(proc.pid)
    out = (tmp_path / "c1.log").read_text(errors="replace")
    # the hint is the command that resumes: the run directory, the recipe and its overrides (run literally by
    # tests/integration/launch/test_stop_signals.py)
    hint = (f"[stapo recipe] stopped by SIGTERM; the last complete checkpoint is {c_dir}/ckpt/global_step_2 (step 2); "
            f"the same command resumes from it: STAPO_RUN_DIR={c_dir} ")
    lines = [line for line in out.splitlines() if line.startswith(hint)]
    assert len(lines) == 1 and " bash recipes/tiny_cpu_stapo.sh " in lines[0], out[-3000:]
    assert all(arg in lines[0] for arg in COMMAND), lines[0]
    assert "Traceback" not in out and "main_ppo failed" not in out, out[-3000:]
    assert not any(note in out for note in ("Aborted", "Terminated", "Killed")), out[-3000:]  # the shell's job notes

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 30  # the job's processes were gone when it exited; allow for the OS's reaping
    while (left := [p for p in job if alive(p)]):
        assert time.monotonic() < deadline, f"processes of the stopped job still running: {left}"
        time.sleep(0.5)
    assert sorted(p.name for p in (c_dir / "ckpt").glob("global_step_*")) == ["global_step_2"]

    again = run_recipe("tiny_cpu_stapo.sh", c_dir, *COMMAND, timeout=900, **ENV)
    assert again.returncode == 0, failure_text(c_dir, again)
    assert "(steps 3-4)" in again.stdout
    assert reproducible(metrics_by_step(c_dir / "metrics.jsonl")) == reproducible(run_a["metrics"])
