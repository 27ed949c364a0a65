"""The recipe rules the dry-run adds to verl's start-up (``stapo_verl.launch.recipe_rules``), on small configs.

The recipes' own configs through the whole dry-run are in ``tests/integration/recipes/test_recipes.py``.
"""

from __future__ import annotations

import json
from typing import Literal, Optional

import pytest
from omegaconf import OmegaConf

from stapo_verl.launch import recipe_rules as R


def _config(**dotted):
    """A composed-config stand-in with the keys the rules read: Megatron TP 2 on one node of 8, dynamic batches."""
    cfg = OmegaConf.create({
        "trainer": {"nnodes": 1, "n_gpus_per_node": 8, "total_training_steps": 10, "total_epochs": 1,
                    "save_freq": 5, "test_freq": 5},
        "data": {"train_batch_size": 4, "max_prompt_length": 100, "max_response_length": 400, "train_files": []},
        "algorithm": {"use_kl_in_reward": False, "rollout_correction": {"rollout_is": None}},
        "ray_kwargs": {"ray_init": {}},
        "actor_rollout_ref": {
            "model": {"path": "Qwen/Qwen3-8B-Base"},
            "actor": {"strategy": "megatron", "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 500,
                      "use_kl_loss": True, "optim": {},
                      "megatron": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
                                   "context_parallel_size": 1, "override_transformer_config": {}}},
            "rollout": {"n": 2, "tensor_model_parallel_size": 2, "log_prob_use_dynamic_bsz": True,
                        "log_prob_max_token_len_per_gpu": 500, "quantization": None},
            "ref": {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": 500},
        },
    })
    for key, value in dotted.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True)
    return cfg


def test_a_config_that_fits_passes_with_its_layout():
    check = R.recipe_checks(_config())
    assert check.detail == ("Megatron DP=4; longest sequence 500 tokens fits 3 dynamic-batch budget(s) (min 500)")
    assert check.status == "PASS" and check.warnings == ()
    lay = R.layout(_config(actor_rollout_ref__actor__strategy="fsdp2"))
    assert (lay.engine, lay.model_parallel, lay.dp, lay.world) == ("fsdp2", 1, 8, 8)


@pytest.mark.parametrize("key,value,message", [
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 3,
     "world size 8 (trainer.nnodes=1 x n_gpus_per_node=8) is not divisible by Megatron TP x PP x CP = 3"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", 3, "vLLM TP=3 does not divide n_gpus_per_node=8"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", 499,
     "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=499 < data.max_prompt_length + data.max_response_length "
     "= 100 + 400 = 500"),
    ("actor_rollout_ref.rollout.quantization", "fp8",
     "actor_rollout_ref.rollout.quantization=fp8 without importance-sampling correction"),
])
def test_a_broken_rule_fails_naming_the_keys(key, value, message):
    with pytest.raises(R.RecipeRuleError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        R.recipe_checks(_config(**{key.replace(".", "__"): value}))


def test_the_ref_budget_counts_only_with_a_reference_model():
    check = R.recipe_checks(_config(actor_rollout_ref__actor__use_kl_loss=False,
                                    actor_rollout_ref__ref__log_prob_max_token_len_per_gpu=1))
    assert "fits 2 dynamic-batch budget(s)" in check.detail


def test_fp8_values_are_the_ones_megatron_core_declares():
    assert R._literal_values(Optional[Literal["e4m3", "hybrid"]]) == ("e4m3", "hybrid", None)
    assert R._literal_values(int) == ()


def test_blockwise_fp8_needs_the_nvte_variable_in_the_workers(monkeypatch):
    monkeypatch.setattr(R, "megatron_choices", lambda name: {"fp8": ("hybrid",), "fp8_recipe": ("blockwise",)}[name])
    tc = "actor_rollout_ref__actor__megatron__override_transformer_config__"
    fp8 = {tc + "fp8": "hybrid", tc + "fp8_recipe": "blockwise"}
    with pytest.raises(R.RecipeRuleError, match=f"blockwise FP8 needs {R.FP8_ENV}=1 in every worker"):
        R.recipe_checks(_config(**fp8))
    env = {f"ray_kwargs__ray_init__runtime_env__env_vars__{R.FP8_ENV}": "1"}
    check = R.recipe_checks(_config(**fp8, **env))
    assert check.warnings == ("optim.override_optimizer_config.fp8_recipe=None differs from 'blockwise'",)
    with pytest.raises(R.RecipeRuleError, match=r"fp8_recipe='delayed': allowed \['blockwise'\]"):
        R.recipe_checks(_config(**{**fp8, tc + "fp8_recipe": "delayed"}, **env))


def test_ray_address_refuses_num_cpus(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert R.check_ray_address({"num_cpus": 4}) == "it starts a local Ray"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert R.check_ray_address({}) == "it connects to RAY_ADDRESS=10.0.0.1:6379"
    with pytest.raises(R.RecipeRuleError, match="ray_kwargs.ray_init.num_cpus is set too"):
        R.check_ray_address({"num_cpus": 4})


def test_model_shape_of_a_local_model(tmp_path):
    assert R.check_model_shape(_config(actor_rollout_ref__model__path="/nowhere/model")).status == "SKIPPED"
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 36, "num_attention_heads": 32,
                                                      "num_key_value_heads": 8}))
    assert R.check_model_shape(_config(actor_rollout_ref__model__path=str(tmp_path))).detail == (
        "layers=36 heads=32 kv_heads=8 fit TP/PP")
    with pytest.raises(R.RecipeRuleError, match="num_hidden_layers=36 .* is not divisible by Megatron PP=8"):
        R.check_model_shape(_config(actor_rollout_ref__model__path=str(tmp_path),
                                    actor_rollout_ref__actor__megatron__pipeline_model_parallel_size=8))


@pytest.mark.parametrize(("model", "heads", "kv"), [("Qwen/Qwen3-1.7B-Base", 16, 8), ("Qwen/Qwen3-8B-Base", 32, 8),
                                                    ("Qwen/Qwen3-14B-Base", 40, 8)])
def test_model_shape_of_a_hub_id_from_the_known_config(model, heads, kv):
    """A hub id is not on this machine; the shape checks still run from the plan's copy of its config.json."""
    from stapo_verl.launch.memory_plan import KNOWN_MODELS

    assert R.check_model_shape(_config(actor_rollout_ref__model__path=model)).detail.startswith(
        f"layers={KNOWN_MODELS[model.split('/')[1][:-5].lower()].layers} heads={heads} kv_heads={kv} fit TP/PP")
    with pytest.raises(R.RecipeRuleError, match=f"num_attention_heads={heads} .* not divisible by Megatron TP=3"):
        R.check_model_shape(_config(actor_rollout_ref__model__path=model,
                                    actor_rollout_ref__actor__megatron__tensor_model_parallel_size=3))
    assert R.check_model_shape(_config(actor_rollout_ref__model__path="someone/unknown-7b")).status == "SKIPPED"


def test_training_length_from_the_parquet_footer(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"x": list(range(9))}), path)  # 9 rows / batch 4 = 2 steps an epoch
    files = {"data__train_files": [str(path)]}
    with pytest.raises(R.RecipeRuleError, match=r"= 1 x 2 = 2 < trainer.total_training_steps=10: .* "
                                                r"trainer.total_epochs>=5"):
        R.check_training_length(_config(**files))
    check = R.check_training_length(_config(**files, trainer__total_epochs=5, trainer__save_freq=-1))
    assert check.status == "PASS" and "9 train rows" in check.detail and "2 steps an epoch" in check.detail
    assert check.warnings == ("trainer.save_freq=-1: the last step 10 gets no checkpoint",)
    absent = R.check_training_length(_config(data__train_files=[str(tmp_path / "none.parquet")]))
    assert absent.status == "SKIPPED" and "none.parquet absent here" in absent.detail
