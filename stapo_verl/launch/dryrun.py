"""Dry-run of a recipe: run verl's own start-up on the composed config, up to where it needs a cluster.

Usage (what ``recipes/run.sh <size> <method> --dry-run`` executes)::

    python -m stapo_verl.launch.dryrun [hydra overrides...]

No GPU, Ray cluster, model weights or data are needed. Steps, in the order a real run meets them:

1. **Plugin.** ``import stapo_verl.plugin`` (verl swallows entry-point import errors, so the import is repeated
   here where it raises) and the ``verl.plugins`` entry point ``stapo`` is in this environment's metadata (that is
   how the Ray workers load it).
2. **Compose** verl's trainer config with the overrides (:func:`stapo_verl.launch.compose.compose_config`), so a
   removed or misspelt key fails with Hydra's / OmegaConf's own message (``Key 'grad_offload' is not in struct``).
3. **verl.trainer.main_ppo.main**, called itself with ``ray.init`` intercepted: ``auto_set_device``,
   ``validate_config`` (with the plugin's checks; it builds the actor config classes through ``_target_``) and
   ``run_ppo``'s ``ray.init`` arguments (the runtime_env merge), which are recorded and not used. Then
   ``policy_loss.loss_mode`` must be in verl's ``POLICY_LOSS_REGISTRY`` (verl looks it up only in the workers).
4. **TaskRunnerV1.run**, called itself with ``transfer_queue.init`` intercepted: the trainer class for
   ``trainer.v1.trainer_mode`` and ``OmegaConf.resolve`` (every interpolation must resolve).
5. **Worker configs:** verl's ``omega_conf_to_dataclass`` of the actor, rollout, rollout checkpoint engine and
   ``algorithm`` (``AlgoConfig``, incl. ``RolloutCorrectionConfig``, which verl itself only reads as a DictConfig).
6. **Recipe checks** verl only meets on GPUs: Megatron world size divisible by TP×PP×CP, every dynamic-batch
   token budget ≥ prompt + response length, vLLM TP divides the node, FP8 keys consistent.
7. **Training length:** the train parquet's row count from its footer — fails when
   ``total_epochs × ⌊rows / train_batch_size⌋ < total_training_steps`` (verl's loop would stop there silently).
8. **Stop tokens:** the ids the rollout stops at (:mod:`stapo_verl.launch.stop_tokens`, from the model's files
   when ``model.path`` is local); warns when the chat template's end-of-turn token is not among them.

What cannot run here (reported as SKIPPED): ``HFModelConfig`` unless ``model.path`` is a local directory with
``config.json``; dataset loading (files are only checked for existence); Ray resource pools, engines, vLLM.

Exit status: 0 when every step passed; 1 on the first failure (the verl / Hydra / OmegaConf message and its cause
chain are printed); 2 on a usage error.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO
from unittest import mock

from stapo_verl.launch.compose import compose_config, data_files, train_rows

PREFIX = "[stapo dry-run]"

#: FP8 values accepted by Megatron-Core's TransformerConfig / verl's FP8 docs.
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("blockwise", "tensorwise", "delayed", "mxfp8")
FP8_ENV = "NVTE_FP8_BLOCK_SCALING_FP32_SCALES"

__all__ = ["DryRunError", "DryRunReport", "compose_config", "dry_run", "main", "ray_init_kwargs"]


class DryRunError(RuntimeError):
    """A recipe-level check failed (the message names the keys and the rule)."""


class _Stop(Exception):
    """Internal: a step failed and was reported; stop the dry-run."""


class _Reached(Exception):
    """Internal: verl's start-up reached the call that needs a cluster (``ray.init`` / ``transfer_queue.init``)."""

    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("reached")
        self.kwargs = kwargs


@dataclass
class DryRunReport:
    """Outcome of :func:`dry_run`.

    Attributes:
        ok: every step passed.
        steps: ``(name, status, detail)`` with status ``PASS`` | ``SKIPPED`` | ``WARN`` | ``FAIL``.
        settings: resolved key settings, ``(key, value)`` in print order.
        config: the composed and resolved config (None when composing failed).
        ray_init: the keyword arguments verl's ``run_ppo`` would pass to ``ray.init`` (None before that step).
    """

    ok: bool = True
    steps: list[tuple[str, str, str]] = field(default_factory=list)
    settings: list[tuple[str, Any]] = field(default_factory=list)
    config: Any = None
    ray_init: dict[str, Any] | None = None

    def setting(self, key: str) -> Any:
        """Return the printed value of ``key``; raises KeyError if it was not printed."""
        for k, v in self.settings:
            if k == key:
                return v
        raise KeyError(key)


# ---------------------------------------------------------------------------------------------------
# verl's start-up, run for real up to the cluster


def _check_plugin() -> str:
    """Import the plugin so its errors surface and check the entry point Ray workers load it through."""
    from importlib.metadata import entry_points

    import stapo_verl.plugin  # noqa: F401  (raises here, unlike verl's entry-point loader)

    eps = [ep for ep in entry_points(group="verl.plugins") if ep.name == "stapo"]
    if not eps:
        raise DryRunError(
            "the 'verl.plugins' entry point 'stapo' is not installed in this environment, so Ray workers "
            "will not load the plugin: `pip install -e <stapo-verl checkout>` on every node"
        )
    return f"stapo_verl.plugin imported; entry point {eps[0].name} = {eps[0].value}"


def _check_loss_registered(config) -> str:
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode not in POLICY_LOSS_REGISTRY:
        raise DryRunError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r} is not registered "
            f"(registered: {sorted(POLICY_LOSS_REGISTRY)})"
        )
    return f"loss_mode {mode!r} registered"


def run_main_until_ray_init(config) -> dict[str, Any]:
    """Call ``verl.trainer.main_ppo.main`` on ``config`` and stop it at ``ray.init``; return that call's kwargs.

    ``main`` runs ``auto_set_device``, ``validate_config`` and ``run_ppo``, whose ``ray.init(**kwargs)`` is replaced
    by a recorder that ends the call (``ray.is_initialized`` reads False, so verl builds the kwargs exactly as for a
    fresh driver). ``os.environ`` is restored afterwards (``run_ppo`` may set determinism variables). Output of
    ``main`` (its ``print`` of the kwargs) is discarded.

    Args:
        config: the composed trainer config (``DictConfig``); verl may modify it in place, as it would.

    Returns:
        The ``ray.init`` keyword arguments as plain containers (``runtime_env`` merged with verl's defaults).

    Raises:
        Whatever verl's ``validate_config`` / config classes raise for a bad config.
        DryRunError: ``main`` returned without calling ``ray.init``.
    """
    import ray
    import verl.trainer.main_ppo as main_ppo

    def record(**kwargs):
        raise _Reached(kwargs)

    env = dict(os.environ)
    try:
        with mock.patch.object(ray, "is_initialized", return_value=False), \
                mock.patch.object(ray, "init", side_effect=record), contextlib.redirect_stdout(io.StringIO()):
            main_ppo.main.__wrapped__(config)  # @hydra.main's functools.wraps keeps the task function here
    except _Reached as reached:
        return reached.kwargs
    finally:
        os.environ.clear()
        os.environ.update(env)
    raise DryRunError("verl.trainer.main_ppo.main returned without calling ray.init")


def ray_init_kwargs(config) -> dict[str, Any]:
    """The keyword arguments verl's ``run_ppo`` passes to ``ray.init`` for ``config`` (see
    :func:`run_main_until_ray_init`; ``config`` is copied first). Its ``runtime_env.env_vars`` reach every task and
    actor of the job, also on a Ray cluster started earlier (the recipes forward the reward settings that way)."""
    import copy

    return run_main_until_ray_init(copy.deepcopy(config))


def _run_main(config, report: DryRunReport) -> str:
    report.ray_init = run_main_until_ray_init(config)
    where = os.environ.get("RAY_ADDRESS")
    if where and report.ray_init.get("num_cpus") is not None:
        raise DryRunError(
            "RAY_ADDRESS is set (connect to an existing cluster) but ray_kwargs.ray_init.num_cpus is set too; "
            "Ray refuses num_cpus when connecting: drop the override"
        )
    n_gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    return (f"auto_set_device, validate_config (n_gpus={n_gpus}) and run_ppo ran up to ray.init; "
            + (f"it connects to RAY_ADDRESS={where}" if where else "it starts a local Ray"))


def _run_task_runner(config) -> str:
    """``TaskRunnerV1.run`` (the class under Ray's actor wrapper), stopped at ``transfer_queue.init``."""
    import transfer_queue
    from verl.trainer.main_ppo import TaskRunnerV1

    if not config.trainer.use_v1:
        return "trainer.use_v1=False: legacy trainer, TaskRunnerV1 not used"

    def record(*args, **kwargs):
        raise _Reached(kwargs)

    runner = TaskRunnerV1.__ray_actor_class__()
    try:
        with mock.patch.object(transfer_queue, "init", side_effect=record), contextlib.redirect_stdout(io.StringIO()):
            runner.run(config)
    except _Reached:
        return f"trainer_mode {config.trainer.v1.trainer_mode!r}; all interpolations resolve"
    raise DryRunError("TaskRunnerV1.run returned without calling transfer_queue.init")


def _run_worker_configs(config) -> str:
    """verl's dataclass conversions of the worker configs (``omega_conf_to_dataclass``)."""
    from verl.utils.config import omega_conf_to_dataclass

    arr = config.actor_rollout_ref
    built = [type(omega_conf_to_dataclass(arr.actor)).__name__, type(omega_conf_to_dataclass(arr.rollout)).__name__,
             type(omega_conf_to_dataclass(arr.rollout.checkpoint_engine)).__name__]
    # verl reads algorithm.* as a DictConfig; AlgoConfig is their typed schema (incl. rollout_correction): it
    # catches a wrong TIS value before the GPUs do. (verl 0.9.1's RewardManagerConfig does not build: not checked.)
    built.append(type(omega_conf_to_dataclass(config.algorithm)).__name__)
    return "built " + ", ".join(built)


def _parallel_sizes(config) -> tuple[str, int, int, int]:
    """``(engine, tp, pp, cp)`` of the actor: Megatron's sizes, or ``(strategy, 1, 1, 1)`` for FSDP."""
    actor = config.actor_rollout_ref.actor
    if actor.strategy == "megatron":
        mg = actor.megatron
        return "megatron", mg.tensor_model_parallel_size, mg.pipeline_model_parallel_size, mg.context_parallel_size
    return str(actor.strategy), 1, 1, 1


def _token_budget_checks(config) -> str:
    """Every dynamic-batch token budget must hold the longest sequence (prompt + response).

    verl's dynamic batching (``rearrange_micro_batches``) cannot place a longer sequence in any micro-batch.

    Raises:
        DryRunError: naming the budget key, its value and the two length keys.
    """
    from verl.trainer.ppo.utils import need_reference_policy

    arr = config.actor_rollout_ref
    longest = config.data.max_prompt_length + config.data.max_response_length
    budgets = []
    if arr.actor.use_dynamic_bsz:
        budgets.append(("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu))
    if arr.rollout.log_prob_use_dynamic_bsz:
        budgets.append(("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                        arr.rollout.log_prob_max_token_len_per_gpu))
    if need_reference_policy(config) and arr.ref.get("log_prob_use_dynamic_bsz", False):
        budgets.append(("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_max_token_len_per_gpu))
    for key, val in budgets:
        if val is None or val < longest:
            raise DryRunError(
                f"{key}={val} < data.max_prompt_length + data.max_response_length = "
                f"{config.data.max_prompt_length} + {config.data.max_response_length} = {longest}: a full-length "
                "sequence fits in no dynamic-batch micro-batch"
            )
    if not budgets:
        return f"no dynamic batch size; longest sequence {longest} tokens"
    smallest = min(v for _, v in budgets)
    return f"longest sequence {longest} tokens fits {len(budgets)} dynamic-batch budget(s) (min {smallest})"


def _recipe_checks(config) -> tuple[str, list[str]]:
    """Checks verl only meets at Megatron / vLLM start-up on GPUs. Returns (detail, warnings)."""
    arr = config.actor_rollout_ref
    engine, tp, pp, cp = _parallel_sizes(config)
    nodes, per_node = config.trainer.nnodes, config.trainer.n_gpus_per_node
    world = nodes * per_node
    mp = tp * pp * cp
    warnings: list[str] = []
    if world % mp:
        raise DryRunError(
            f"world size {world} (trainer.nnodes={nodes} x n_gpus_per_node={per_node}) is not divisible by "
            f"Megatron TP x PP x CP = {mp}; Megatron's parallel-state initialisation would fail"
        )
    if tp > per_node:
        warnings.append(f"Megatron TP={tp} spans nodes (> {per_node} GPUs a node)")
    rtp = arr.rollout.tensor_model_parallel_size
    if per_node % rtp:
        raise DryRunError(f"vLLM TP={rtp} does not divide n_gpus_per_node={per_node}")
    budgets = _token_budget_checks(config)
    dp = world // mp
    responses = config.data.train_batch_size * arr.rollout.n
    if responses % dp:
        warnings.append(f"{responses} responses a step do not split evenly over {engine} DP={dp}")
    if engine != "megatron":
        if config.actor_rollout_ref.rollout.get("quantization", None) == "fp8":
            raise DryRunError("actor_rollout_ref.rollout.quantization=fp8 is set up for the Megatron recipes only")
        return f"{engine} DP={dp}; {budgets}", warnings
    mg = arr.actor.megatron

    tc = mg.get("override_transformer_config", {}) or {}
    fp8 = tc.get("fp8", None)
    quant = arr.rollout.get("quantization", None)
    rc = config.algorithm.get("rollout_correction", {}) or {}
    if fp8 not in (None, False):
        if fp8 not in FP8_FORMATS:
            raise DryRunError(f"override_transformer_config.fp8={fp8!r}: allowed {list(FP8_FORMATS)}")
        recipe = tc.get("fp8_recipe", None)
        if recipe not in FP8_RECIPES:
            raise DryRunError(f"override_transformer_config.fp8_recipe={recipe!r}: allowed {list(FP8_RECIPES)}")
        if mg.get("dynamic_context_parallel", False):
            raise DryRunError("dynamic_context_parallel does not support FP8 training (verl megatron engine)")
        if recipe == "blockwise":
            env = (config.ray_kwargs.ray_init.get("runtime_env", {}) or {}).get("env_vars", {}) or {}
            if str(env.get(FP8_ENV, "")) != "1":
                raise DryRunError(
                    f"blockwise FP8 needs {FP8_ENV}=1 in every worker: "
                    f"+ray_kwargs.ray_init.runtime_env.env_vars.{FP8_ENV}='1' (verl docs/low_precision/fp8.md)"
                )
        opt_recipe = (arr.actor.optim.get("override_optimizer_config", {}) or {}).get("fp8_recipe", None)
        if opt_recipe != recipe:
            warnings.append(f"optim.override_optimizer_config.fp8_recipe={opt_recipe!r} differs from {recipe!r}")
    if quant == "fp8" and not rc.get("rollout_is", None):
        raise DryRunError(
            "actor_rollout_ref.rollout.quantization=fp8 without importance-sampling correction: set "
            "algorithm.rollout_correction.rollout_is=token (verl's FP8 docs: accuracy drops without TIS)"
        )
    return f"Megatron DP={dp}; {budgets}", warnings


def _model_checks(config) -> tuple[str, str]:
    """HFModelConfig and model-shape checks when model.path is a local HF directory. Returns (status, detail)."""
    arr = config.actor_rollout_ref
    path = str(arr.model.path)
    cfg_json = os.path.join(os.path.expanduser(path), "config.json")
    if not os.path.isfile(cfg_json):
        return "SKIPPED", (
            f"model.path={path!r} is not a local HF directory: HFModelConfig (tokenizer/config loading) and the "
            "model-shape checks (layers % PP, heads % TP) did not run"
        )
    import json

    from verl.utils.config import omega_conf_to_dataclass

    with open(cfg_json, encoding="utf-8") as f:
        hf = json.load(f)
    layers, heads = hf.get("num_hidden_layers"), hf.get("num_attention_heads")
    kv = hf.get("num_key_value_heads", heads)
    _, tp, pp, _ = _parallel_sizes(config)
    rtp = arr.rollout.tensor_model_parallel_size
    if layers and layers % pp:
        raise DryRunError(f"num_hidden_layers={layers} is not divisible by Megatron PP={pp}")
    for name, t in (("Megatron TP", tp), ("vLLM TP", rtp)):
        if heads and heads % t:
            raise DryRunError(f"num_attention_heads={heads} is not divisible by {name}={t}")
        if kv and kv % t and t % kv:
            raise DryRunError(f"num_key_value_heads={kv} and {name}={t}: neither divides the other")
    # Shape first (pure JSON), then what the worker builds: HF config + tokenizer, no weights.
    omega_conf_to_dataclass(arr.model)
    return "PASS", f"HFModelConfig built; layers={layers} heads={heads} kv_heads={kv} fit TP/PP"


def _schedule_checks(config) -> tuple[str, str, list[str]]:
    """The run trains the steps it states, and its last step gets a checkpoint and a validation.

    verl 0.9.1's loop (``verl.trainer.ppo.v1.trainer_base`` ``fit``) also stops at ``trainer.total_epochs``, with
    ⌊rows / train_batch_size⌋ steps an epoch (the dataloader drops the last incomplete batch), silently; verl has no
    such check. It saves and validates at the last step when ``save_freq`` / ``test_freq`` > 0.

    Returns:
        ``(status, detail, warnings)``; status ``SKIPPED`` when the train parquet is absent here.
    Raises:
        DryRunError: too few epochs (naming ``trainer.total_epochs``, the rows, ``data.train_batch_size`` and
            ``trainer.total_training_steps``), or fewer rows than one batch.
    """
    import math

    tr = config.trainer
    bs = config.data.train_batch_size
    steps, epochs = tr.total_training_steps, tr.total_epochs
    rows, missing = train_rows(config)
    warnings: list[str] = []
    last = steps
    if rows is None:
        status = "SKIPPED"
        detail = (f"train parquet {missing[0]} absent here: the total_epochs x rows check did not run "
                  f"(trainer.total_epochs={epochs}, trainer.total_training_steps={steps})")
    else:
        per_epoch = rows // bs
        if per_epoch == 0:
            raise DryRunError(f"data.train_files holds {rows} rows < data.train_batch_size={bs}: no training step")
        reach = epochs * per_epoch
        if steps is not None and reach < steps:
            raise DryRunError(
                f"trainer.total_epochs={epochs} x floor({rows} rows of data.train_files / data.train_batch_size={bs}) "
                f"= {epochs} x {per_epoch} = {reach} < trainer.total_training_steps={steps}: verl's loop would stop "
                f"silently at step {reach}, without the final checkpoint and validation; set "
                f"trainer.total_epochs>={math.ceil(steps / per_epoch)}"
            )
        last = reach if steps is None else steps
        status = "PASS"
        detail = (f"{rows} train rows (parquet metadata; before filter_overlong_prompts) / batch {bs} = {per_epoch} "
                  f"steps an epoch x trainer.total_epochs={epochs} = {reach} >= {last} steps")
    for key, what in (("save_freq", "checkpoint"), ("test_freq", "validation")):
        freq = tr[key]
        if freq is None or freq <= 0:
            warnings.append(f"trainer.{key}={freq}: the last step {last} gets no {what}")
    return status, detail, warnings


def _stop_token_checks(config) -> tuple[str, str, str, list[str]]:
    """The stop setting that reaches the rollout config, and the ids it makes the rollout stop at.

    Returns ``(status, detail, stop_ids, warnings)``; SKIPPED when ``model.path`` is not a local HF directory
    (the recipes then resolve the ids at launch). Warns when the model's chat template ends a turn with a token
    the rollout would not stop at (Qwen3 base: ``<|im_end|>``).
    """
    from omegaconf import OmegaConf

    from stapo_verl.launch import stop_tokens

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config"
    gc = OmegaConf.select(config, key, default=None)
    path = os.path.expanduser(str(config.actor_rollout_ref.model.path))
    setting = f"{key}={gc!r}"
    if not os.path.isfile(os.path.join(path, "config.json")):
        return "SKIPPED", (f"{setting}; model.path is not a local HF directory, so the stop ids are read at launch "
                           f"(python -m stapo_verl.launch.stop_tokens --model <model.path> --out <that folder>)"), "", []
    stop = stop_tokens.resolve(path)
    warnings: list[str] = []
    folder_pending = gc not in (None, "", *stop_tokens.VLLM_GENERATION_CONFIG_KEYWORDS) and not os.path.isfile(
        os.path.join(os.path.expanduser(str(gc)), "generation_config.json"))
    if folder_pending:
        effective = list(stop.ids)
        source = "folder written at launch by stapo_verl.launch.stop_tokens"
    else:
        effective = stop_tokens.effective_stop_ids(path, None if gc is None else str(gc))
        source = "as configured"
    missing = [i for i in stop.ids if i not in effective]
    if missing:
        warnings.append(
            f"the rollout stops at {effective} but the model also ends turns/sequences with "
            f"{[stop.tokens[i] for i in missing]}: responses may run on into invented turns; point "
            f"+{key} at a folder written by `python -m stapo_verl.launch.stop_tokens --model {path} --out <folder>` "
            "(the recipes do, with STOP_AT_END_OF_TURN=1)"
        )
    ids = ", ".join(f"{i} {stop.tokens.get(i, '?')}" for i in effective)
    return "PASS", f"{setting} ({source}): the rollout stops at [{ids}]", f"[{ids}]", warnings


def _data_checks(config) -> tuple[str, str]:
    files = data_files(config.data.get("train_files")) + data_files(config.data.get("val_files"))
    missing = [f for f in files if not os.path.exists(os.path.expanduser(f))]
    if missing:
        return "SKIPPED", f"dataset loading not run; {len(missing)}/{len(files)} files absent here (fine for a dry-run)"
    return "PASS", f"all {len(files)} data files exist (dataset loading itself not run)"


# ---------------------------------------------------------------------------------------------------
# Summary


def _summary(config) -> list[tuple[str, Any]]:
    from omegaconf import OmegaConf

    def sel(key: str) -> Any:
        return OmegaConf.select(config, key, default=None)

    arr = "actor_rollout_ref."
    mg = arr + "actor.megatron."
    pl = arr + "actor.policy_loss."
    keys = [
        arr + "model.path",
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        mg + "tensor_model_parallel_size",
        mg + "pipeline_model_parallel_size",
        mg + "context_parallel_size",
        mg + "param_offload",
        mg + "optimizer_offload",
        mg + "use_mbridge",
        mg + "use_dist_checkpointing",
        mg + "dtype",
        arr + "rollout.name",
        arr + "rollout.mode",
        arr + "rollout.tensor_model_parallel_size",
        arr + "rollout.gpu_memory_utilization",
        "data.train_batch_size",
        arr + "rollout.n",
        arr + "actor.ppo_mini_batch_size",
        arr + "actor.ppo_epochs",
        "data.max_prompt_length",
        "data.max_response_length",
        arr + "actor.use_dynamic_bsz",
        arr + "actor.ppo_max_token_len_per_gpu",
        arr + "rollout.log_prob_max_token_len_per_gpu",
        arr + "actor.optim.lr",
        arr + "actor.optim.lr_warmup_steps",
        arr + "actor.optim.lr_decay_style",
        arr + "actor.optim.weight_decay",
        arr + "actor.optim.clip_grad",
        arr + "actor.clip_ratio_low",
        arr + "actor.clip_ratio_high",
        arr + "actor.clip_ratio_c",
        arr + "actor.loss_agg_mode",
        pl + "loss_mode",
        pl + "token_mask",
        pl + "_target_",
        pl + "tau_p",
        pl + "entropy_quantile",
        pl + "stats_source",
        pl + "top_entropy_ratio",
        arr + "actor.calculate_entropy",
        arr + "actor.entropy_coeff",
        arr + "actor.use_kl_loss",
        arr + "actor.kl_loss_type",
        arr + "actor.kl_loss_coef",
        "algorithm.adv_estimator",
        "algorithm.use_kl_in_reward",
        arr + "rollout.temperature",
        arr + "rollout.top_p",
        arr + "rollout.val_kwargs.do_sample",
        arr + "rollout.val_kwargs.n",
        arr + "rollout.val_kwargs.temperature",
        arr + "rollout.val_kwargs.top_p",
        arr + "rollout.engine_kwargs.vllm.generation_config",
        mg + "override_transformer_config.fp8",
        mg + "override_transformer_config.fp8_recipe",
        arr + "actor.optim.override_optimizer_config.fp8_recipe",
        arr + "rollout.quantization",
        "algorithm.rollout_correction.rollout_is",
        "algorithm.rollout_correction.rollout_is_threshold",
        "reward.reward_manager.name",
        "reward.custom_reward_function.path",
        "reward.custom_reward_function.name",
        "data.train_files",
        "data.dataloader_num_workers",
        arr + "actor.strategy",
        "trainer.total_training_steps",
        "trainer.total_epochs",
        "trainer.test_freq",
        "trainer.save_freq",
        "trainer.project_name",
        "trainer.experiment_name",
        "trainer.default_local_dir",
    ]
    out: list[tuple[str, Any]] = []
    for k in keys:
        v = sel(k)
        if k.startswith(pl) and k != pl + "loss_mode" and v is None:
            continue  # keys only the STAPO config class has
        out.append((k, v))
    world = sel("trainer.nnodes") * sel("trainer.n_gpus_per_node")
    _, tp, pp, cp = _parallel_sizes(config)
    mp = tp * pp * cp
    fp8 = sel(mg + "override_transformer_config.fp8")
    recipe = sel(mg + "override_transformer_config.fp8_recipe")
    precision = "bf16" if fp8 in (None, False) else f"fp8 (TE {fp8}/{recipe})"
    if sel(arr + "actor.strategy") != "megatron":
        mixed = sel(arr + "actor.fsdp_config.mixed_precision") or {}
        precision = (f"{sel(arr + 'actor.fsdp_config.model_dtype')} weights, "
                     f"{mixed.get('param_dtype', 'bf16') if hasattr(mixed, 'get') else mixed} compute (FSDP)")
    if sel(arr + "rollout.quantization"):
        precision += f", rollout {sel(arr + 'rollout.quantization')}"
    ray_address = os.environ.get("RAY_ADDRESS")
    out += [
        ("derived.precision", precision),
        ("derived.world_size", world),
        ("derived.engine", sel(arr + "actor.strategy")),
        ("derived.dp", world // mp if mp else None),
        ("derived.megatron_dp", world // mp if mp and sel(arr + "actor.strategy") == "megatron" else None),
        ("derived.rollout_replicas", world // sel(arr + "rollout.tensor_model_parallel_size")),
        ("derived.responses_per_step", sel("data.train_batch_size") * sel(arr + "rollout.n")),
        (
            "derived.optimizer_steps_per_step",
            sel("data.train_batch_size") // sel(arr + "actor.ppo_mini_batch_size") * sel(arr + "actor.ppo_epochs"),
        ),
        ("derived.ray", f"RAY_ADDRESS={ray_address}" if ray_address else "local ray.init"),
        # STAPO_* settings shipped to every Ray worker through ray_init.runtime_env (e.g. the reward timeout).
        ("derived.worker_env", {k: v for k, v in (sel("ray_kwargs.ray_init.runtime_env.env_vars") or {}).items()
                                if str(k).startswith("STAPO_")}),
    ]
    return out


# ---------------------------------------------------------------------------------------------------
# Driver


def _format_exception(exc: BaseException) -> str:
    lines = [f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"]
    seen = {id(exc)}
    cur = exc.__cause__ or exc.__context__
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        lines.append(f"  caused by {type(cur).__module__}.{type(cur).__qualname__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    return "\n".join(lines)


def dry_run(overrides: list[str], out: TextIO | None = None) -> DryRunReport:
    """Compose and validate the recipe config given by ``overrides``; print the steps and key settings.

    Never raises for a config problem: failures are recorded in the returned report (``ok=False``) and
    printed with the verl / Hydra / OmegaConf message. Source: verl 0.9.1 ``verl.trainer.main_ppo.main``,
    ``run_ppo`` and ``TaskRunnerV1.run``, which it runs up to ``ray.init`` / ``transfer_queue.init``.

    Args:
        overrides: Hydra overrides, exactly as passed to ``python -m verl.trainer.main_ppo``.
        out: stream for the report (default ``sys.stdout``).
    """
    out = out or sys.stdout
    report = DryRunReport()
    derived: dict[str, Any] = {}

    def emit(line: str = "") -> None:
        print(line, file=out, flush=True)

    def step(name: str, fn: Callable[[], Any]) -> Any:
        try:
            res = fn()
        except Exception as exc:  # noqa: BLE001  (every failure is reported, then the run stops)
            report.ok = False
            report.steps.append((name, "FAIL", _format_exception(exc)))
            emit(f"{PREFIX} FAIL  {name}")
            emit(_format_exception(exc))
            if os.environ.get("STAPO_DRYRUN_TRACEBACK"):
                emit("".join(traceback.format_exception(exc)))
            raise _Stop from exc
        status, detail = res if isinstance(res, tuple) and res[0] in ("PASS", "SKIPPED") else ("PASS", res)
        report.steps.append((name, status, str(detail)))
        emit(f"{PREFIX} {status:<5} {name}: {detail}")
        return res

    try:
        step("plugin import + entry point", _check_plugin)

        def compose() -> str:
            report.config = compose_config(overrides)
            return f"verl's trainer config with {len(overrides)} overrides"

        step("hydra compose (main_ppo's config)", compose)
        config = report.config
        step("main_ppo.main: auto_set_device + validate_config + run_ppo up to ray.init",
             lambda: _run_main(config, report))
        step("loss mode registered", lambda: _check_loss_registered(config))
        step("TaskRunnerV1.run up to transfer_queue.init", lambda: _run_task_runner(config))
        step("worker config dataclasses", lambda: _run_worker_configs(config))

        def recipe() -> str:
            detail, warns = _recipe_checks(config)
            for w in warns:
                report.steps.append(("recipe checks", "WARN", w))
                emit(f"{PREFIX} WARN  {w}")
            return detail

        step("recipe checks (Megatron/vLLM start-up rules)", recipe)

        def with_warnings(name: str, res: tuple) -> tuple[str, str]:
            *head, warns = res
            for w in warns:
                report.steps.append((name, "WARN", w))
                emit(f"{PREFIX} WARN  {w}")
            return head[0], head[1]

        step("training length (epochs x rows, last-step checkpoint/validation)",
             lambda: with_warnings("training length", _schedule_checks(config)))

        step("HFModelConfig + model shape", lambda: _model_checks(config))

        def stops() -> tuple[str, str]:
            status, detail, ids, warns = _stop_token_checks(config)
            derived["derived.stop_token_ids"] = ids or "resolved at launch"
            return with_warnings("stop tokens", (status, detail, warns))

        step("stop tokens reaching the rollout", stops)
        step("data files", lambda: _data_checks(config))
        step("Ray resource pools, Megatron/vLLM init", lambda: ("SKIPPED", "need GPUs and a Ray cluster"))
    except _Stop:
        emit(f"{PREFIX} FAILED: the config would not start (message above is verl's / Hydra's own)")
        return report

    report.settings = _summary(config) + list(derived.items())
    emit(f"{PREFIX} resolved key settings:")
    width = max(len(k) for k, _ in report.settings)
    for k, v in report.settings:
        emit(f"  {k:<{width}} = {v}")
    emit(f"{PREFIX} OK")
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``python -m stapo_verl.launch.dryrun <hydra overrides...>``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if any(a.startswith("--") for a in argv):
        print(f"{PREFIX} usage: python -m stapo_verl.launch.dryrun <hydra overrides...> (got {argv})", file=sys.stderr)
        return 2
    return 0 if dry_run(argv).ok else 1


if __name__ == "__main__":
    sys.exit(main())
