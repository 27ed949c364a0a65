"""The recipes' start-up rules that verl 0.9.1 meets only on GPUs, or not at all, checked on the composed config.

The dry-run (:mod:`stapo_verl.launch.dryrun`) runs them after verl's own start-up. Each reads the config only (and,
where named, the files it points at), raises :class:`RecipeRuleError` naming the keys and the rule, and returns a
:class:`Check`: the line the dry-run prints, its warnings and a derived value.

* :func:`recipe_checks`: the world size is divisible by Megatron's TP×PP×CP (verl's ``validate_config`` checks it only
  without dynamic batch size; Megatron's ``initialize_model_parallel`` on the GPUs), vLLM's TP divides a node, every
  dynamic-batch token budget holds the longest sequence (verl's ``rearrange_micro_batches`` cannot place a longer
  one), and the FP8 keys are consistent (their values as Megatron-Core's ``TransformerConfig`` declares them);
* :func:`check_ray_address`: ``ray.init`` arguments Ray refuses when it connects to a running cluster;
* :func:`check_model_shape`: layers and heads of the model (a local one's config.json, else the shape the memory
  plan knows for Qwen3 1.7B / 8B / 14B by hub id or path) divide over TP / PP;
* :func:`check_training_length`: the train parquet's rows (footer only) reach ``trainer.total_training_steps``;
* :func:`check_stop_tokens`: the ids the rollout will stop at (:mod:`stapo_verl.stop_tokens`).

The data files' columns, data sources and prompt lengths are :mod:`stapo_verl.launch.data_checks`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass
from typing import Any

from stapo_verl.launch.compose import train_rows

_A = "actor_rollout_ref"
_TC = f"{_A}.actor.megatron.override_transformer_config"
#: the environment variable blockwise FP8 needs in every worker (verl docs/low_precision/fp8.md)
FP8_ENV = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"
STOP_KEY = f"{_A}.rollout.engine_kwargs.vllm.generation_config"
DERIVED_STOP_IDS = "derived.stop_token_ids"


class RecipeRuleError(ValueError):
    """A recipe rule does not hold; the message names the keys, their values and the rule."""


@dataclass(frozen=True)
class Check:
    """Outcome of a rule that holds.

    Attributes:
        detail: one line for the dry-run's output.
        status: ``PASS``, or ``SKIPPED`` when the rule could not run here (e.g. a file absent on this machine).
        warnings: lines the dry-run prints as ``WARN``.
        value: a derived setting ``(name, value)`` the dry-run prints among the settings (None: nothing).
    """

    detail: str
    status: str = "PASS"
    warnings: tuple[str, ...] = ()
    value: Any = None


@dataclass(frozen=True)
class Layout:
    """Where the job runs: the actor's engine with its Megatron sizes (1 for FSDP), the nodes and the rollout TP."""

    engine: str
    tp: int
    pp: int
    cp: int
    nodes: int
    per_node: int
    rollout_tp: int

    @property
    def world(self) -> int:
        return self.nodes * self.per_node

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.world // self.model_parallel


def layout(config) -> Layout:
    """The :class:`Layout` of a composed trainer config. Raises nothing beyond OmegaConf's missing-key errors."""
    arr, tp, pp, cp = config.actor_rollout_ref, 1, 1, 1
    if arr.actor.strategy == "megatron":
        mg = arr.actor.megatron
        tp, pp, cp = mg.tensor_model_parallel_size, mg.pipeline_model_parallel_size, mg.context_parallel_size
    return Layout(str(arr.actor.strategy), tp, pp, cp, config.trainer.nnodes, config.trainer.n_gpus_per_node,
                  arr.rollout.tensor_model_parallel_size)


def recipe_checks(config) -> Check:
    """Parallel layout, token budgets and FP8 keys: what verl meets only at Megatron / vLLM start-up on GPUs.

    Raises:
        RecipeRuleError: the world size is not divisible by Megatron TP x PP x CP; vLLM's TP does not divide
            ``trainer.n_gpus_per_node``; a token budget is below prompt + response length; FP8 keys are inconsistent.
    """
    lay = layout(config)
    if lay.world % lay.model_parallel:
        raise RecipeRuleError(
            f"world size {lay.world} (trainer.nnodes={lay.nodes} x n_gpus_per_node={lay.per_node}) is not divisible "
            f"by Megatron TP x PP x CP = {lay.model_parallel}; Megatron's parallel-state initialisation would fail")
    if lay.per_node % lay.rollout_tp:
        raise RecipeRuleError(f"vLLM TP={lay.rollout_tp} does not divide n_gpus_per_node={lay.per_node}")
    warnings = [f"Megatron TP={lay.tp} spans nodes (> {lay.per_node} GPUs a node)"] if lay.tp > lay.per_node else []
    responses = config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    if responses % lay.dp:
        warnings.append(f"{responses} responses a step do not split evenly over {lay.engine} DP={lay.dp}")
    warnings += _fp8_warnings(config, lay)
    engine = "Megatron" if lay.engine == "megatron" else lay.engine
    return Check(f"{engine} DP={lay.dp}; {_token_budgets(config)}", warnings=tuple(warnings))


def _token_budgets(config) -> str:
    """Every dynamic-batch token budget (actor, rollout log-prob, ref log-prob) holds prompt + response length.

    Raises:
        RecipeRuleError: naming the budget key, its value and the two length keys.
    """
    from verl.trainer.ppo.utils import need_reference_policy

    arr, data = config.actor_rollout_ref, config.data
    longest = data.max_prompt_length + data.max_response_length
    budgets = [(f"{_A}.{part}.{key}", node[key]) for part, node, key, on in (
        ("actor", arr.actor, "ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz),
        ("rollout", arr.rollout, "log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz),
        ("ref", arr.ref, "log_prob_max_token_len_per_gpu",
         need_reference_policy(config) and arr.ref.get("log_prob_use_dynamic_bsz", False))) if on]
    for key, val in budgets:
        if val is None or val < longest:
            raise RecipeRuleError(
                f"{key}={val} < data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
                f"{data.max_response_length} = {longest}: a full-length sequence fits in no dynamic-batch micro-batch")
    if not budgets:
        return f"no dynamic batch size; longest sequence {longest} tokens"
    return (f"longest sequence {longest} tokens fits {len(budgets)} dynamic-batch budget(s) "
            f"(min {min(v for _, v in budgets)})")


def megatron_choices(name: str) -> tuple | None:
    """The values Megatron-Core's ``TransformerConfig`` declares for its field ``name`` (an ``Optional[Literal]``;
    ``()`` for a type without ``Literal`` values), or None when megatron-core is not installed here. Raises KeyError
    for a field it does not have."""
    try:
        from megatron.core.transformer.transformer_config import TransformerConfig
    except ImportError:
        return None
    return _literal_values({f.name: f.type for f in dataclasses.fields(TransformerConfig)}[name])


def _literal_values(kind) -> tuple:
    """The values a type allows when it is made of ``Literal`` s, ``None`` and unions of them (else ``()``)."""
    if typing.get_origin(kind) is typing.Literal:
        return typing.get_args(kind)
    if kind is type(None):
        return (None,)
    return tuple(v for arg in typing.get_args(kind) for v in _literal_values(arg))


def _fp8_warnings(config, lay: Layout) -> list[str]:
    """FP8 training keys (Megatron only) and the FP8 rollout's importance-sampling correction.

    Raises:
        RecipeRuleError: an FP8 value Megatron-Core does not declare; FP8 with ``dynamic_context_parallel`` (verl's
            megatron engine refuses it); blockwise FP8 without ``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1`` in the
            workers' ``runtime_env``; an FP8 rollout without ``algorithm.rollout_correction.rollout_is``, or with FSDP.
    """
    arr = config.actor_rollout_ref
    quant = arr.rollout.get("quantization", None)
    if lay.engine != "megatron":
        if quant == "fp8":
            raise RecipeRuleError(f"{_A}.rollout.quantization=fp8 is set up for the Megatron recipes only")
        return []
    mg, warnings = arr.actor.megatron, []
    tc = mg.get("override_transformer_config", {}) or {}
    fp8, recipe = tc.get("fp8", None), tc.get("fp8_recipe", None)
    if fp8 not in (None, False):
        for key, value in (("fp8", fp8), ("fp8_recipe", recipe)):
            allowed = megatron_choices(key)
            if not allowed:  # megatron-core not installed here, or a field type without Literal values
                warnings.append(f"{_TC}.{key}={value!r} not checked: no Megatron-Core TransformerConfig values here")
            elif value not in allowed:
                raise RecipeRuleError(
                    f"{_TC}.{key}={value!r}: allowed {list(allowed)} (Megatron-Core TransformerConfig)")
        if mg.get("dynamic_context_parallel", False):
            raise RecipeRuleError("dynamic_context_parallel does not support FP8 training (verl megatron engine)")
        env = (config.ray_kwargs.ray_init.get("runtime_env", {}) or {}).get("env_vars", {}) or {}
        if recipe == "blockwise" and str(env.get(FP8_ENV, "")) != "1":
            raise RecipeRuleError(f"blockwise FP8 needs {FP8_ENV}=1 in every worker: +ray_kwargs.ray_init."
                                  f"runtime_env.env_vars.{FP8_ENV}='1' (verl docs/low_precision/fp8.md)")
        opt_recipe = (arr.actor.optim.get("override_optimizer_config", {}) or {}).get("fp8_recipe", None)
        if opt_recipe != recipe:
            warnings.append(f"optim.override_optimizer_config.fp8_recipe={opt_recipe!r} differs from {recipe!r}")
    if quant == "fp8" and not (config.algorithm.get("rollout_correction", {}) or {}).get("rollout_is", None):
        raise RecipeRuleError(
            f"{_A}.rollout.quantization=fp8 without importance-sampling correction: set "
            "algorithm.rollout_correction.rollout_is=token (verl's FP8 docs: accuracy drops without TIS)")
    return warnings


def check_ray_address(ray_init: dict) -> str:
    """Where ``ray.init`` goes with these arguments (verl's ``run_ppo`` builds them).

    Raises:
        RecipeRuleError: ``RAY_ADDRESS`` is set (connect to a cluster) and so is ``num_cpus``, which Ray refuses then.
    """
    where = os.environ.get("RAY_ADDRESS")
    if where and ray_init.get("num_cpus") is not None:
        raise RecipeRuleError(
            "RAY_ADDRESS is set (connect to an existing cluster) but ray_kwargs.ray_init.num_cpus is set too; "
            "Ray refuses num_cpus when connecting: drop the override")
    return f"it connects to RAY_ADDRESS={where}" if where else "it starts a local Ray"


def local_model(config) -> str | None:
    """``model.path`` when it is a local HF directory (with ``config.json``), else None. Raises nothing."""
    path = os.path.expanduser(str(config.actor_rollout_ref.model.path))
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def check_model_shape(config) -> Check:
    """Layers divide over Megatron PP, attention and KV heads over Megatron's and vLLM's TP, from the model's config:
    ``config.json`` of a local ``model.path``, else the shape the memory plan knows for a hub id or path of the
    recipes' models (:func:`stapo_verl.launch.memory_plan.model_shape`: Qwen3 1.7B / 8B / 14B, their HF
    ``config.json`` values).

    Returns:
        SKIPPED when ``model.path`` is neither local nor a model the plan knows; the detail names where the shape
        came from when it is not local.
    Raises:
        RecipeRuleError: naming the model's field, its value, the parallel size and where the shape came from.
    """
    from stapo_verl.launch.memory_plan import model_shape

    path = local_model(config)
    if path is not None:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            hf = json.load(f)
        layers, heads = hf.get("num_hidden_layers"), hf.get("num_attention_heads")
        kv, source = hf.get("num_key_value_heads", heads), os.path.join(path, "config.json")
    else:
        shape, source = model_shape(str(config.actor_rollout_ref.model.path))
        if shape is None:
            return Check(f"model.path={str(config.actor_rollout_ref.model.path)!r} is not a local HF directory nor "
                         "a model the plan knows: HFModelConfig (tokenizer/config loading) and the model-shape checks "
                         "(layers % PP, heads % TP) did not run", status="SKIPPED")
        layers, heads, kv = shape.layers, shape.heads, shape.kv_heads
    lay = layout(config)
    if layers and layers % lay.pp:
        raise RecipeRuleError(f"num_hidden_layers={layers} ({source}) is not divisible by Megatron PP={lay.pp}")
    for name, t in (("Megatron TP", lay.tp), ("vLLM TP", lay.rollout_tp)):
        if heads and heads % t:
            raise RecipeRuleError(f"num_attention_heads={heads} ({source}) is not divisible by {name}={t}")
        if kv and kv % t and t % kv:
            raise RecipeRuleError(f"num_key_value_heads={kv} ({source}) and {name}={t}: neither divides the other")
    where = "" if path is not None else f" (from {source}; HFModelConfig not built: the model is not on this machine)"
    return Check(f"layers={layers} heads={heads} kv_heads={kv} fit TP/PP{where}")


def check_training_length(config) -> Check:
    """The run trains the steps it states, and its last step gets a checkpoint and a validation.

    verl 0.9.1's loop (``verl.trainer.ppo.v1.trainer_base`` ``fit``) also stops at ``trainer.total_epochs``, with
    ⌊rows / train_batch_size⌋ steps an epoch (the dataloader drops the last incomplete batch), silently; verl has no
    such check. It saves and validates at the last step when ``save_freq`` / ``test_freq`` > 0 (else a warning).

    Returns:
        SKIPPED when the train parquet is absent here.
    Raises:
        RecipeRuleError: too few epochs (naming ``trainer.total_epochs``, the rows, ``data.train_batch_size`` and
            ``trainer.total_training_steps``, and the epochs needed), or fewer rows than one batch.
    """
    tr, bs = config.trainer, config.data.train_batch_size
    steps, epochs = tr.total_training_steps, tr.total_epochs
    rows, missing = train_rows(config)
    if rows is None:
        last, status = steps, "SKIPPED"
        detail = (f"train parquet {missing[0]} absent here: the total_epochs x rows check did not run "
                  f"(trainer.total_epochs={epochs}, trainer.total_training_steps={steps})")
    else:
        per_epoch = rows // bs
        if per_epoch == 0:
            raise RecipeRuleError(f"data.train_files holds {rows} rows < data.train_batch_size={bs}: no training step")
        reach = epochs * per_epoch
        if steps is not None and reach < steps:
            raise RecipeRuleError(
                f"trainer.total_epochs={epochs} x floor({rows} rows of data.train_files / data.train_batch_size={bs}) "
                f"= {epochs} x {per_epoch} = {reach} < trainer.total_training_steps={steps}: verl's loop would stop "
                f"silently at step {reach}, without the final checkpoint and validation; set "
                f"trainer.total_epochs>={math.ceil(steps / per_epoch)}")
        last, status = (reach if steps is None else steps), "PASS"
        detail = (f"{rows} train rows (parquet metadata; before filter_overlong_prompts) / batch {bs} = {per_epoch} "
                  f"steps an epoch x trainer.total_epochs={epochs} = {reach} >= {last} steps")
    warnings = tuple(f"trainer.{key}={tr[key]}: the last step {last} gets no {what}"
                     for key, what in (("save_freq", "checkpoint"), ("test_freq", "validation"))
                     if tr[key] is None or tr[key] <= 0)
    return Check(detail, status, warnings)


def check_stop_tokens(config) -> Check:
    """The stop setting that reaches the rollout config, and the ids it makes the rollout stop at.

    Returns:
        ``value``: ``derived.stop_token_ids``, the ids with their tokens (``[0 <|endoftext|>, 2 <|im_end|>]``);
        SKIPPED when ``model.path`` is
        not a local HF directory (the recipes resolve the ids at launch). Warns when the model ends a turn with a
        token the rollout would not stop at (Qwen3 base: ``<|im_end|>``).
    Raises:
        FileNotFoundError: the setting names a folder that is neither written at launch nor present
            (:func:`stapo_verl.stop_tokens.effective_stop_ids`); OSError, ValueError: as
            :func:`stapo_verl.stop_tokens.resolve`.
    """
    from omegaconf import OmegaConf

    from stapo_verl import stop_tokens

    gc, path = OmegaConf.select(config, STOP_KEY, default=None), local_model(config)
    setting = f"{STOP_KEY}={gc!r}"
    if path is None:
        return Check(f"{setting}; model.path is not a local HF directory, so the stop ids are read at launch "
                     "(python -m stapo_verl.stop_tokens --model <model.path> --out <that folder>)", "SKIPPED",
                     value=(DERIVED_STOP_IDS, "resolved at launch"))
    stop = stop_tokens.resolve(path)
    pending = gc not in (None, "", *stop_tokens.VLLM_GENERATION_CONFIG_KEYWORDS) and not os.path.isfile(
        os.path.join(os.path.expanduser(str(gc)), "generation_config.json"))
    effective = list(stop.ids) if pending else stop_tokens.effective_stop_ids(path, None if gc is None else str(gc))
    missing = [i for i in stop.ids if i not in effective]
    warnings = (f"the rollout stops at {effective} but the model also ends turns/sequences with "
                f"{[stop.tokens[i] for i in missing]}: responses may run on into invented turns; point +{STOP_KEY} at "
                f"a folder written by `python -m stapo_verl.stop_tokens --model {path} --out <folder>` (the "
                "recipes do, with STOP_AT_END_OF_TURN=1)",) if missing else ()
    ids = "[" + ", ".join(f"{i} {stop.tokens.get(i, '?')}" for i in effective) + "]"
    source = "folder written at launch by stapo_verl.stop_tokens" if pending else "as configured"
    return Check(f"{setting} ({source}): the rollout stops at {ids}", warnings=warnings, value=(DERIVED_STOP_IDS, ids))
