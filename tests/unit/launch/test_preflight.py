"""The preflight's checks (``stapo_verl.launch.preflight``), one test each, with the GPU and route facts stubbed
(passed in as :class:`GpuFacts` / :class:`RouteFacts`), each failing naming what was found, what is needed, the fix."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from stapo_verl.launch import preflight as P
from stapo_verl.launch.errors import EXIT_CONFIG

H100 = P.GpuFacts(driver="580.65.06", cuda="13.0", count=8, memory_gb=85.5)


def _config(tmp_path, **dotted):
    """The keys the checks read, shaped as the 8B recipe composes them; files under ``tmp_path``."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    train = tmp_path / "train.parquet"
    train.write_bytes(b"x")
    cfg = OmegaConf.create({
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8, "logger": ["console", "wandb"],
                    "default_local_dir": str(tmp_path / "ckpt" / "run")},
        "data": {"train_files": [str(train)], "val_files": [], "max_prompt_length": 1024,
                 "max_response_length": 15360},
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {}}}},
        "actor_rollout_ref": {
            "model": {"path": str(model), "use_fused_kernels": False},
            "actor": {"strategy": "megatron", "ppo_max_token_len_per_gpu": 32768, "calculate_entropy": False,
                      "entropy_coeff": 0, "policy_loss": {"stats_source": "old_policy"},
                      "megatron": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                   "context_parallel_size": 1, "param_offload": True, "optimizer_offload": True,
                                   "use_distributed_optimizer": True, "sequence_parallel": True,
                                   "use_mbridge": True, "vanilla_mbridge": False,
                                   "override_transformer_config": {"recompute_granularity": "full"}}},
            "rollout": {"name": "vllm", "tensor_model_parallel_size": 2, "gpu_memory_utilization": 0.6,
                        "log_prob_max_token_len_per_gpu": 65536, "checkpoint_engine": {},
                        "engine_kwargs": {"vllm": {"generation_config": str(tmp_path / "ckpt" / "genconfig")}}},
        },
    })
    for key, value in dotted.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


def test_driver_older_than_the_images_cuda_is_refused():
    assert P.check_driver(H100) == "driver 580.65.06 runs CUDA 13.0 (needs >= 580)"
    with pytest.raises(P.PreflightError, match=r"NVIDIA driver 570.124.06 < 580, which CUDA 13.0 .* Fix: a node "
                                               r"with driver >= 580"):
        P.check_driver(P.GpuFacts("570.124.06", "13.0", 8, 85.5))
    with pytest.raises(P.PreflightError, match="torch here is a CPU build"):
        P.check_driver(P.GpuFacts("580.65.06", None, 8, 85.5))
    with pytest.raises(P.PreflightError, match="no NVIDIA driver answers"):
        P.check_driver(P.GpuFacts(None, "13.0", 0, None))


def test_fewer_gpus_than_the_config_asks_for_are_refused():
    assert P.check_gpu_count(H100, 2, 8).startswith("8 GPUs visible = trainer.n_gpus_per_node; world 2 x 8")
    with pytest.raises(P.PreflightError, match=r"4 GPUs visible on this node .* needed: trainer.n_gpus_per_node=8 "
                                               r"on each of trainer.nnodes=2. Fix: GPUS_PER_NODE=4"):
        P.check_gpu_count(P.GpuFacts("580.65.06", "13.0", 4, 85.5), 2, 8)


REQUIRES = ('vllm==0.24.0; extra == "vllm"', 'torch==2.11.0; extra == "vllm"', 'megatron-core; extra == "megatron"',
            'megatron-bridge==0.5.2; extra == "megatron"', 'transformers<5.11,>=5.5.3')
GOOD_ROUTE = P.RouteFacts(
    versions={"vllm": "0.24.0", "torch": "2.11.0+cu130", "megatron-core": "0.18.0", "megatron-bridge": "0.5.2",
              "transformer-engine": "2.16.1", "nvidia-modelopt": "0.44.0"},
    import_errors={m: None for m in P.ROUTE_MODULES.values()}, verl_requires=REQUIRES)


def test_the_production_route_imports_at_verls_pins(tmp_path):
    cfg = _config(tmp_path)
    extras, dists = P.route_distributions(cfg), P.route_modules(cfg)
    assert extras == ("vllm", "megatron")
    assert dists == ("vllm", "megatron-core", "transformer-engine", "megatron-bridge", "nvidia-modelopt")
    assert "pins hold: vllm==0.24.0, torch==2.11.0+cu130, megatron-bridge==0.5.2" in P.check_route(GOOD_ROUTE, extras,
                                                                                                   dists)
    no_modelopt = P.RouteFacts(GOOD_ROUTE.versions, {**GOOD_ROUTE.import_errors,
                                                     "megatron.bridge": "ModuleNotFoundError: No module named "
                                                                        "'modelopt'"}, REQUIRES)
    with pytest.raises(P.PreflightError, match=r"`import megatron.bridge` \(megatron-bridge\) fails: "
                                               r"ModuleNotFoundError: No module named 'modelopt'"):
        P.check_route(no_modelopt, extras, dists)
    old_vllm = P.RouteFacts({**GOOD_ROUTE.versions, "vllm": "0.23.1"}, GOOD_ROUTE.import_errors, REQUIRES)
    with pytest.raises(P.PreflightError, match=r"vllm 0.23.1; verl 0.9.1's \[vllm,megatron\] extra needs "
                                               r"vllm==0.24.0. Fix: pip install 'vllm==0.24.0'"):
        P.check_route(old_vllm, extras, dists)


def test_wandb_without_credentials_is_refused_before_ray():
    def has(module):
        return True

    with pytest.raises(P.PreflightError, match=r"'wandb' but there are no credentials .* Fix: export WANDB_API_KEY"):
        P.check_trackers(["console", "wandb"], {}, (), has)
    for env, hosts in (({"WANDB_API_KEY": "k"}, ()), ({"WANDB_MODE": "offline"}, ()), ({}, ("api.wandb.ai",))):
        assert P.check_trackers(["console", "wandb"], env, hosts, has).startswith("trackers")
    with pytest.raises(P.PreflightError, match="'mlflow' but `import mlflow` fails"):
        P.check_trackers(["mlflow"], {}, (), lambda module: module != "mlflow")


def test_the_key_shipped_to_the_workers_counts(tmp_path):
    cfg = _config(tmp_path, ray_kwargs__ray_init__runtime_env__env_vars__WANDB_MODE="offline")
    [(name, thunk), *_] = P.gpu_free_checks(cfg, {}, (), lambda module: True)
    assert name == "trackers" and thunk().startswith("trackers ['console', 'wandb']")


def test_unreadable_model_data_or_unwritable_checkpoints_are_refused(tmp_path):
    cfg = _config(tmp_path)
    assert "checkpoints writable under" in P.check_paths(cfg, {})
    with pytest.raises(P.PreflightError, match=r"model.path=.*nope.*no readable config.json"):
        P.check_paths(_config(tmp_path, actor_rollout_ref__model__path=str(tmp_path / "nope")), {})
    with pytest.raises(P.PreflightError, match=r"data.val_files: .*aime24.parquet' is not a readable file"):
        P.check_paths(_config(tmp_path, data__val_files=[str(tmp_path / "aime24.parquet")]), {})
    with pytest.raises(P.PreflightError, match="is a HF hub id but HF_HUB_OFFLINE=1"):
        P.check_paths(_config(tmp_path, actor_rollout_ref__model__path="Qwen/Qwen3-8B-Base"), {"HF_HUB_OFFLINE": "1"})
    blocker = tmp_path / "a_file"  # a path under a regular file cannot be created (also as root)
    blocker.write_text("")
    with pytest.raises(P.PreflightError, match=r"default_local_dir=.*a_file.*is not writable. Fix: CKPT_DIR="):
        P.check_paths(_config(tmp_path, trainer__default_local_dir=str(blocker / "run")), {})


def test_the_stop_token_folder_must_be_readable_or_writable_and_shared(tmp_path):
    cfg = _config(tmp_path)
    assert "is written at launch" in P.check_generation_config(cfg)
    folder = tmp_path / "ckpt" / "genconfig"
    folder.mkdir(parents=True)
    (folder / "generation_config.json").write_text("{}")
    assert P.check_generation_config(cfg).endswith("readable")
    gc = "actor_rollout_ref__rollout__engine_kwargs__vllm__generation_config"
    with pytest.raises(P.PreflightError, match=r"is under /tmp, which the other 1 node\(s\) do not see"):
        P.check_generation_config(_config(tmp_path, trainer__nnodes=2, **{gc: "/tmp/genconfig"}))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(P.PreflightError, match=r"no generation_config.json there and .*a_file' is not writable"):
        P.check_generation_config(_config(tmp_path, **{gc: str(blocker / "genconfig")}))


def test_the_memory_plan_must_fit_the_gpu(tmp_path):
    cfg = _config(tmp_path, actor_rollout_ref__model__path="Qwen/Qwen3-8B-Base")
    assert P.check_memory(cfg, 85.5).startswith("peak actor update 62.9 of 85.5 GB")
    with pytest.raises(P.PreflightError, match=r"(?s)actor update needs 62.9 GB > the GPU's 48.0 GB.*lower it: "
                                               r"actor_rollout_ref.model.use_fused_kernels=True"):
        P.check_memory(cfg, 48.0)


def test_run_stops_at_the_first_failure_with_the_config_exit_code(tmp_path, capsys):
    import io

    cfg = _config(tmp_path, actor_rollout_ref__model__path=str(tmp_path / "model"))
    out = io.StringIO()
    old = P.GpuFacts("535.104.05", "13.0", 8, 85.5)
    assert P.run(cfg, old, GOOD_ROUTE, {"WANDB_MODE": "offline"}, (), out) == EXIT_CONFIG
    assert out.getvalue().splitlines() == [
        "[stapo preflight] ERROR CUDA driver: NVIDIA driver 535.104.05 < 580, which CUDA 13.0 (this torch's) needs: "
        "CUDA fails to initialise in every worker. Fix: a node with driver >= 580, or an image built for the "
        "driver's CUDA"]


@pytest.mark.parametrize(("recipe", "capability", "ok"), [
    ("blockwise", (9, 0), True), ("mxfp8", (9, 0), False), ("mxfp8", (10, 0), True), ("blockwise", (10, 0), False),
    ("tensorwise", (8, 9), True), ("tensorwise", (8, 0), False)])
def test_the_fp8_recipe_matches_the_gpu_generation(recipe, capability, ok):
    """FP8_RECIPE=mxfp8 (Blackwell's) passed an H100's preflight without a word; each recipe is checked against the
    compute capability the preflight finds, and the fix it names passes."""
    from omegaconf import OmegaConf

    def config(r):
        return OmegaConf.create({"actor_rollout_ref": {"actor": {"megatron": {"override_transformer_config": {
            "fp8": "hybrid", "fp8_recipe": r}}}}})

    gpu = P.GpuFacts("580.65.06", "13.0", 8, 85.5, capability)
    if ok:
        assert P.check_fp8_recipe(config(recipe), gpu).startswith(f"fp8_recipe={recipe!r} on compute capability")
        return
    with pytest.raises(P.PreflightError, match=r"Fix: ") as err:
        P.check_fp8_recipe(config(recipe), gpu)
    fix = str(err.value).split("Fix: ")[1]
    if fix.startswith("FP8_RECIPE="):
        assert P.check_fp8_recipe(config(fix.split()[0].split("=")[1]), gpu)  # the suggested recipe passes
    bf16 = OmegaConf.create({"actor_rollout_ref": {"actor": {"megatron": {"override_transformer_config": {}}}}})
    assert P.check_fp8_recipe(bf16, gpu) == "BF16: no FP8 recipe"


def test_the_launch_refuses_a_row_without_ground_truth(tmp_path):
    """The GPU recipes' preflight (before Ray) runs the row checks of the tiny launcher and the dry run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from stapo_verl.data.schema import arrow_schema

    rows = [{"data_source": "math_dapo", "prompt": [{"role": "user", "content": f"What is {i}+1?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": gt},
             "extra_info": {"split": "train", "index": i, "benchmark": "math_dapo", "problem_id": str(i),
                            "source_row": i, "problem": "q"}} for i, gt in enumerate(["1", None])]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), tmp_path / "train.parquet")
    config = OmegaConf.create({
        "data": {"train_files": [str(tmp_path / "train.parquet")], "val_files": [], "max_prompt_length": 64},
        "reward": {"custom_reward_function": {"path": "pkg://stapo_verl.rewards"}},
        "actor_rollout_ref": {"model": {"path": str(tmp_path / "no_model")}}})
    with pytest.raises(P.PreflightError, match=r"1 of 2 rows cannot be scored: row 1 reward_model\.ground_truth None"):
        P.check_data_files(config)
    import inspect

    assert "check_data_files(config)" in inspect.getsource(P.all_checks)  # among the launch's checks
