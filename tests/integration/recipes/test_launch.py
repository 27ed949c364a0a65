"""Launching the recipes, without training: ``STAPO_VENV`` points at a stub venv whose python records the
``main_ppo`` / dry-run / stop-token / report calls and runs everything else (assets, the console) with the real
interpreter; the tiny run's ``python -m stapo_verl.launch.train`` runs for real with main_ppo replaced by a recorder
(``STAPO_MAIN_PPO``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from support.procs import REPO, TESTS
from support.recipes import RECORD_MAIN_PPO, bash, calls, module_calls, stub_venv

RECIPES = REPO / "recipes"


def test_training_launch_gets_exactly_the_dry_run_overrides(tmp_path):
    env = {"STAPO_VENV": str(stub_venv(tmp_path)), "STUB_OUT": str(tmp_path / "train")}
    assert bash(["recipes/qwen3_14b_stapo.sh", "x.y=1"], env=env).returncode == 0
    env["STUB_OUT"] = str(tmp_path / "dry")
    assert bash(["recipes/qwen3_14b_stapo.sh", "--dry-run", "x.y=1"], env=env).returncode == 0
    (train,) = module_calls(tmp_path / "train", "verl.trainer.main_ppo")
    (dry,) = module_calls(tmp_path / "dry", "stapo_verl.launch.dryrun")
    assert train[3:] == dry[3:]
    assert train[-1] == "x.y=1"


def test_stapo_venv_is_the_interpreter_of_every_recipe(tmp_path):
    """STAPO_VENV=<venv> bash recipes/qwen3_8b_stapo.sh --dry-run runs <venv>/bin/python."""
    venv = stub_venv(tmp_path)
    env = {"STAPO_VENV": str(venv), "STUB_OUT": str(tmp_path / "out")}
    proc = bash(["recipes/qwen3_8b_stapo.sh", "--dry-run"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(module_calls(tmp_path / "out", "stapo_verl.launch.dryrun")) == 1
    assert f"python={venv}/bin/python" in proc.stderr
    # A STAPO_VENV without an interpreter is an error naming it, not a silent fallback to another python.
    proc = bash(["recipes/qwen3_8b_stapo.sh", "--dry-run"], env={"STAPO_VENV": str(tmp_path / "nope")})
    assert proc.returncode == 2
    assert f"STAPO_VENV='{tmp_path / 'nope'}' has no bin/python" in proc.stderr


def test_launch_writes_the_stop_token_generation_config_first(tmp_path):
    """Training starts by writing the folder engine_kwargs.vllm.generation_config names."""
    env = {"STAPO_VENV": str(stub_venv(tmp_path)), "STUB_OUT": str(tmp_path / "out"), "CKPT_DIR": str(tmp_path)}
    assert bash(["recipes/qwen3_8b_stapo.sh"], env=env).returncode == 0
    recorded = calls(tmp_path / "out")
    # the preflight first (the same overrides as main_ppo), then the stop-token folder, then training
    assert [c[2] for c in recorded] == ["stapo_verl.launch.preflight", "stapo_verl.stop_tokens",
                                        "verl.trainer.main_ppo"]
    assert recorded[0][3:] == recorded[2][3:]
    folder = str(tmp_path / "stapo" / "qwen3-8b-stapo-bf16" / "generation_config")
    assert recorded[1][3:] == ["--model", "Qwen/Qwen3-8B-Base", "--out", folder]
    assert f"+actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config='{folder}'" in recorded[2]
    # opting out drops both
    env["STUB_OUT"] = str(tmp_path / "out2")
    assert bash(["recipes/qwen3_8b_stapo.sh"], env={**env, "STOP_AT_END_OF_TURN": "0"}).returncode == 0
    preflight, only = calls(tmp_path / "out2")
    assert preflight[2] == "stapo_verl.launch.preflight" and preflight[3:] == only[3:]
    assert only[2] == "verl.trainer.main_ppo" and not any("generation_config" in a for a in only)


def test_multi_node_needs_an_existing_ray_cluster(tmp_path):
    env = {"STAPO_VENV": str(stub_venv(tmp_path)), "STUB_OUT": str(tmp_path / "out"), "NNODES": "2"}
    proc = bash(["recipes/qwen3_8b_stapo.sh"], env=env)
    assert proc.returncode == 2
    assert "RAY_ADDRESS" in proc.stderr
    assert not (tmp_path / "out").exists()
    # With RAY_ADDRESS the recipe launches main_ppo (whose ray.init connects there) and starts no Ray.
    proc = bash(["recipes/qwen3_8b_stapo.sh"], env={**env, "RAY_ADDRESS": "10.0.0.1:6379"})
    assert proc.returncode == 0, proc.stderr
    (out,) = module_calls(tmp_path / "out", "verl.trainer.main_ppo")
    assert out[0] == "RAY_ADDRESS=10.0.0.1:6379"
    assert "trainer.nnodes=2" in out
    for script in RECIPES.rglob("*.sh"):
        assert not re.search(r"^\s*ray\s+start", script.read_text(), re.M), script


# --------------------------------------------------------------------------------------------------
# the tiny run: Hydra decides whether there is anything to train


def _finished_run(tmp_path: Path, step: int) -> tuple[Path, dict[str, str]]:
    """A tiny run dir whose checkpoint (as verl writes it) is at ``step``, and the env that launches into it with
    main_ppo replaced by a recorder (``STAPO_MAIN_PPO``)."""
    run = tmp_path / "run"
    (run / "ckpt" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (run / "ckpt" / "latest_checkpointed_iteration.txt").write_text(f"{step}")
    (run / "metrics.jsonl").write_text(f'{{"step": {step}, "data": {{}}}}\n')
    env = {"STAPO_VENV": str(stub_venv(tmp_path)), "STUB_OUT": str(tmp_path / "calls"), "STAPO_RUN_DIR": str(run),
           "STAPO_MAIN_PPO": RECORD_MAIN_PPO, "PYTHONPATH": str(TESTS)}
    return run, env


def test_finished_tiny_run_is_not_run_again(tmp_path):
    run, env = _finished_run(tmp_path, 20)
    metrics = (run / "metrics.jsonl").read_bytes()
    proc = bash(["recipes/tiny_cpu_stapo.sh"], env=env)
    assert proc.returncode == 0, proc.stderr
    assert "is at step 20 and this invocation trains until step 20" in proc.stdout
    assert "bash recipes/tiny_cpu_stapo.sh trainer.total_training_steps=30" in proc.stdout  # how to go on
    assert not (tmp_path / "calls").exists()  # no training, no report of an old run
    assert (run / "metrics.jsonl").read_bytes() == metrics and not list(run.glob("metrics.*.jsonl"))
    assert not (run / "wall.json").exists() and not (run / "ckpt" / "generation_config").exists()


def test_more_steps_in_any_hydra_spelling_train_on(tmp_path):
    """``++key=v`` (and a later override of the same key) mean to Hydra what they mean to verl; the recipe does not
    read them itself. Training on keeps the run's metrics.jsonl rows up to the checkpoint and writes the stop-token
    config first."""
    run, env = _finished_run(tmp_path, 20)
    proc = bash(["recipes/tiny_cpu_stapo.sh", "++trainer.total_training_steps=22"], env=env)
    assert proc.returncode == 0, proc.stderr
    (main,) = module_calls(tmp_path / "calls", "verl.trainer.main_ppo")
    assert main[-1] == "++trainer.total_training_steps=22"
    assert len(module_calls(tmp_path / "calls", "stapo_verl.plots")) == 1  # the report of the run's metrics
    assert "[stapo recipe] training" in proc.stdout and "(steps 21-22)" in proc.stdout
    # the run's metrics stay one file: the checkpoint's steps kept, this invocation's rows (none: recorded) added
    assert (run / "metrics.jsonl").read_text() == json.dumps({"step": 20, "data": {}}) + "\n"
    assert not list(run.glob("metrics.*.jsonl"))
    gen = json.loads((run / "ckpt" / "generation_config" / "generation_config.json").read_text())
    assert len(gen["eos_token_id"]) == 2  # end of sequence and end of turn
    assert json.loads((run / "wall.json").read_text())["returncode"] == 0
    # Ray's workers run at the launcher's priority (Ray's default nice 15 starves them beside other CPU work)
    assert (tmp_path / "calls.env").read_text() == "RAY_worker_niceness=0\n"

    # a checkpoint elsewhere (trainer.default_local_dir) or resume_mode=disable: there is something to train
    run2, env2 = _finished_run(tmp_path / "b", 20)
    for i, extra in enumerate((f"trainer.default_local_dir={tmp_path / 'elsewhere'}", "trainer.resume_mode=disable")):
        out = tmp_path / "b" / f"calls{i}"
        proc = bash(["recipes/tiny_cpu_stapo.sh", extra], env={**env2, "STUB_OUT": str(out)})
        assert proc.returncode == 0, proc.stderr
        assert [c[2] for c in calls(out)] == ["verl.trainer.main_ppo"]
        assert "(steps 1-20)" in proc.stdout
    proc = bash(["recipes/tiny_cpu_stapo.sh", "trainer.resume_mode=disable"],
                env={**env2, "STUB_OUT": str(tmp_path / "b" / "calls2"), "RAY_worker_niceness": "5"})
    assert proc.returncode == 0 and (tmp_path / "b" / "calls2.env").read_text() == "RAY_worker_niceness=5\n"


def test_overrides_that_do_not_compose_stop_the_tiny_run(tmp_path):
    run, env = _finished_run(tmp_path, 20)
    proc = bash(["recipes/tiny_cpu_stapo.sh", "trainer.total_trainig_steps=22"], env=env)
    assert proc.returncode == 2
    assert "total_trainig_steps" in proc.stdout + proc.stderr
    assert not (tmp_path / "calls").exists()
