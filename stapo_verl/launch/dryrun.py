"""Dry-run of a recipe: run verl's own start-up on the composed config, up to where it needs a cluster.

Usage (what ``recipes/run.sh <size> <method> --dry-run`` executes)::

    python -m stapo_verl.launch.dryrun [hydra overrides...]

No GPU, Ray cluster, model weights or data are needed. Steps, in the order a real run meets them (docs/recipes.md §9):

1. **Compose** verl's trainer config (:func:`stapo_verl.launch.compose.compose_config`): a removed or misspelt key
   fails with Hydra's / OmegaConf's own message (``Key 'grad_offload' is not in struct``).
2. **Plugin:** ``import stapo_verl.plugin`` (verl's entry-point loader swallows its errors), the ``verl.plugins``
   entry point ``stapo`` (how Ray workers load it) and, for a job asking for it (``loss_mode=stapo`` or a
   ``token_mask``), the plugin's verl gate: on another verl this step fails naming both versions.
3. **verl's start-up, called itself:** ``main_ppo.main`` (``auto_set_device``, ``validate_config`` with the plugin's
   checks, ``run_ppo``) up to ``ray.init``, whose arguments are recorded; verl's ``get_policy_loss_fn`` for
   ``policy_loss.loss_mode``; ``TaskRunnerV1.run`` (trainer class, ``OmegaConf.resolve``) up to
   ``transfer_queue.init``; ``omega_conf_to_dataclass`` of the actor, rollout, checkpoint engine and ``algorithm``.
4. **Recipe rules** verl meets only on GPUs, or not at all (:mod:`stapo_verl.launch.recipe_rules`): parallel layout,
   token budgets, FP8 keys; training length from the train parquet's footer; the model shape, then verl's
   ``HFModelConfig``, when ``model.path`` is a local HF directory; the stop tokens reaching the rollout; data files.

SKIPPED: ``HFModelConfig`` unless ``model.path`` is local; dataset loading; Ray resource pools, engines, vLLM.

Exit status: 0 when every step passed; 1 on the first failure (the verl / Hydra / OmegaConf message and its cause
chain are printed; ``STAPO_DRYRUN_TRACEBACK=1`` adds the traceback); 2 on a usage error.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO
from unittest import mock

from stapo_verl.integration.verl_0_9_1 import IncompatibleVerlError
from stapo_verl.launch import recipe_rules
from stapo_verl.launch.compose import compose_config
from stapo_verl.launch.recipe_rules import Check

PREFIX = "[stapo dry-run]"

__all__ = ["DryRunError", "DryRunReport", "compose_config", "dry_run", "main", "ray_init_kwargs"]

_A = "actor_rollout_ref."
_MG = _A + "actor.megatron."
_PL = _A + "actor.policy_loss."
#: the settings printed after the steps, in order; (prefix, keys)
SUMMARY_KEYS = tuple(prefix + key for prefix, keys in (
    (_A, "model.path"), ("trainer.", "nnodes n_gpus_per_node"),
    (_MG, "tensor_model_parallel_size pipeline_model_parallel_size context_parallel_size param_offload "
          "optimizer_offload use_mbridge use_dist_checkpointing dtype"),
    (_A + "rollout.", "name mode tensor_model_parallel_size gpu_memory_utilization"), ("data.", "train_batch_size"),
    (_A, "rollout.n actor.ppo_mini_batch_size actor.ppo_epochs"), ("data.", "max_prompt_length max_response_length"),
    (_A, "actor.use_dynamic_bsz actor.ppo_max_token_len_per_gpu rollout.log_prob_max_token_len_per_gpu"),
    (_A + "actor.optim.", "lr lr_warmup_steps lr_decay_style weight_decay clip_grad"),
    (_A + "actor.", "clip_ratio_low clip_ratio_high clip_ratio_c loss_agg_mode"),
    (_PL, "loss_mode token_mask _target_ s2t_tau_p s2t_entropy_quantile stats_source top_entropy_ratio"),
    (_A + "actor.", "calculate_entropy entropy_coeff use_kl_loss kl_loss_type kl_loss_coef"),
    ("algorithm.", "adv_estimator use_kl_in_reward"),
    (_A + "rollout.", "temperature top_p val_kwargs.do_sample val_kwargs.n val_kwargs.temperature val_kwargs.top_p "
                      "engine_kwargs.vllm.generation_config"),
    (_MG + "override_transformer_config.", "fp8 fp8_recipe"),
    (_A, "actor.optim.override_optimizer_config.fp8_recipe rollout.quantization"),
    ("algorithm.rollout_correction.", "rollout_is rollout_is_threshold"),
    ("reward.", "reward_manager.name custom_reward_function.path custom_reward_function.name"),
    ("data.", "train_files dataloader_num_workers"), (_A, "actor.strategy"),
    ("trainer.", "total_training_steps total_epochs test_freq save_freq project_name experiment_name "
                 "default_local_dir"),
) for key in keys.split())


class DryRunError(RuntimeError):
    """verl's start-up did not reach the call the dry-run stops at, a loss mode is not registered, or the plugin's
    entry point is missing (the message says which and what to do)."""


class _Reached(Exception):
    """Internal: verl's start-up reached the call that needs a cluster (``ray.init`` / ``transfer_queue.init``)."""

    def __init__(self, kwargs: dict[str, Any]):
        super().__init__("reached")
        self.kwargs = kwargs


def _record(*args, **kwargs):
    """``side_effect`` of the intercepted call: raises :class:`_Reached` with its keyword arguments."""
    raise _Reached(kwargs)


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


def _check_plugin(config) -> str:
    """Import the plugin, find the entry point Ray workers load it through, and gate the verl for a STAPO job.

    Raises:
        DryRunError: no ``verl.plugins`` entry point ``stapo`` in this environment.
        IncompatibleVerlError: the job asks for the plugin on a verl it was not written for (both versions named;
            :func:`stapo_verl.integration.verl_0_9_1.policy_loss.config.require_plugin_loaded`, the check verl
            meets when it builds the config).
        Whatever ``import stapo_verl.plugin`` raises.
    """
    from importlib.metadata import entry_points

    import stapo_verl.plugin  # noqa: F401  (raises here, unlike verl's entry-point loader)
    from stapo_verl.integration import verl_0_9_1 as integration
    from stapo_verl.integration.verl_0_9_1.policy_loss.config import plugin_request, require_plugin_loaded

    eps = [ep for ep in entry_points(group="verl.plugins") if ep.name == "stapo"]
    if not eps:
        raise DryRunError(
            "the 'verl.plugins' entry point 'stapo' is not installed in this environment, so Ray workers "
            "will not load the plugin: `pip install -e <stapo-verl checkout>` on every node"
        )
    pl = config.actor_rollout_ref.actor.policy_loss
    asked = plugin_request(pl.get("loss_mode", None), pl.get("token_mask", None))
    if asked:
        require_plugin_loaded(asked)
    gate = ("integration installed" if integration.installed() else
            "integration inactive on this verl (warning above), not needed by this job")
    return f"stapo_verl.plugin imported; entry point {eps[0].name} = {eps[0].value}; {gate}"


def run_main_until_ray_init(config) -> dict[str, Any]:
    """Call ``verl.trainer.main_ppo.main`` on ``config`` and stop it at ``ray.init``; return that call's kwargs.

    ``main`` runs ``auto_set_device``, ``validate_config`` and ``run_ppo``, whose ``ray.init(**kwargs)`` is replaced
    by a recorder that ends the call (``ray.is_initialized`` reads False, so verl builds the kwargs exactly as for a
    fresh driver). ``os.environ`` is restored afterwards (``run_ppo`` may set determinism variables). Output of
    ``main`` (its ``print`` of the kwargs) is discarded. Both mocks are ledger entries of ``main_ppo.main``.

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

    env = dict(os.environ)
    try:
        with mock.patch.object(ray, "is_initialized", return_value=False), \
                mock.patch.object(ray, "init", side_effect=_record), contextlib.redirect_stdout(io.StringIO()):
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
    actor of the job, also on a Ray cluster started earlier (the recipes forward the reward settings that way).

    Raises:
        As :func:`run_main_until_ray_init`.
    """
    return run_main_until_ray_init(copy.deepcopy(config))


def _run_main(config, report: DryRunReport) -> str:
    """:func:`run_main_until_ray_init`, recorded in ``report``; raises as it, and RecipeRuleError for RAY_ADDRESS."""
    report.ray_init = run_main_until_ray_init(config)
    n_gpus = config.trainer.n_gpus_per_node * config.trainer.nnodes
    return (f"auto_set_device, validate_config (n_gpus={n_gpus}) and run_ppo ran up to ray.init; "
            + recipe_rules.check_ray_address(report.ray_init))


def _check_loss_registered(config) -> str:
    """verl's own lookup of the loss (``get_policy_loss_fn``, which the workers call at the first loss).

    Raises:
        DryRunError: the loss mode is not registered (verl's ValueError, listing the registered ones, is its cause).
    """
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    try:
        fn = get_policy_loss_fn(mode)
    except ValueError as e:
        raise DryRunError(f"{_PL}loss_mode={mode!r} is not registered: the workers would fail at the first loss") from e
    return f"loss_mode {mode!r} registered ({fn.__module__}.{fn.__name__})"


def _run_task_runner(config) -> str:
    """``TaskRunnerV1.run`` (the class under Ray's actor wrapper), stopped at ``transfer_queue.init`` (a ledger
    entry of ``TaskRunnerV1.run``).

    Raises:
        Whatever verl's trainer selection or ``OmegaConf.resolve`` raise; DryRunError: ``run`` returned without
        calling ``transfer_queue.init``.
    """
    import transfer_queue
    from verl.trainer.main_ppo import TaskRunnerV1

    if not config.trainer.use_v1:
        return "trainer.use_v1=False: legacy trainer, TaskRunnerV1 not used"
    try:
        with mock.patch.object(transfer_queue, "init", side_effect=_record), contextlib.redirect_stdout(io.StringIO()):
            TaskRunnerV1.__ray_actor_class__().run(config)
    except _Reached:
        return f"trainer_mode {config.trainer.v1.trainer_mode!r}; all interpolations resolve"
    raise DryRunError("TaskRunnerV1.run returned without calling transfer_queue.init")


def _build_worker_configs(config) -> str:
    """verl's dataclass conversions of the worker configs (``omega_conf_to_dataclass``); raises as verl's classes.

    verl reads ``algorithm.*`` as a DictConfig; ``AlgoConfig`` is its typed schema (incl. ``rollout_correction``): it
    catches a wrong TIS value before the GPUs do. (verl 0.9.1's ``RewardManagerConfig`` does not build: not checked.)
    """
    from verl.utils.config import omega_conf_to_dataclass

    arr = config.actor_rollout_ref
    nodes = (arr.actor, arr.rollout, arr.rollout.checkpoint_engine, config.algorithm)
    return "built " + ", ".join(type(omega_conf_to_dataclass(node)).__name__ for node in nodes)


def _build_model_config(config) -> Check:
    """The model shape (:func:`~stapo_verl.launch.recipe_rules.check_model_shape`, also for a hub id the plan
    knows), then verl's ``HFModelConfig`` (HF config and tokenizer, no weights) when ``model.path`` is local; raises as
    those two."""
    from verl.utils.config import omega_conf_to_dataclass

    shape = recipe_rules.check_model_shape(config)
    if shape.status == "SKIPPED" or recipe_rules.local_model(config) is None:  # a hub id: no config to load here
        return shape
    omega_conf_to_dataclass(config.actor_rollout_ref.model)
    return Check(f"HFModelConfig built; {shape.detail}")


def _summary(config) -> list[tuple[str, Any]]:
    """The printed settings: :data:`SUMMARY_KEYS` (policy-loss keys only the plugin's class has are left out when
    absent) and the derived values. Raises nothing for a config that passed the steps."""
    from omegaconf import OmegaConf

    def sel(key: str) -> Any:
        return OmegaConf.select(config, key, default=None)

    out = [(k, sel(k)) for k in SUMMARY_KEYS
           if not (k.startswith(_PL) and k != _PL + "loss_mode" and sel(k) is None)]
    lay = recipe_rules.layout(config)
    fp8, tc = sel(_MG + "override_transformer_config.fp8"), _MG + "override_transformer_config.fp8_recipe"
    precision = "bf16" if fp8 in (None, False) else f"fp8 (TE {fp8}/{sel(tc)})"
    if lay.engine != "megatron":
        precision = (f"{sel(_A + 'actor.fsdp_config.model_dtype')} weights, "
                     f"{sel(_A + 'actor.fsdp_config.mixed_precision.param_dtype') or 'bf16'} compute (FSDP)")
    quant = sel(_A + "rollout.quantization")
    ray_address = os.environ.get("RAY_ADDRESS")
    train_batch = sel("data.train_batch_size")
    return out + [
        ("derived.precision", precision + (f", rollout {quant}" if quant else "")),
        ("derived.world_size", lay.world),
        ("derived.engine", lay.engine),
        ("derived.dp", lay.dp),
        ("derived.megatron_dp", lay.dp if lay.engine == "megatron" else None),
        ("derived.rollout_replicas", lay.world // lay.rollout_tp),
        ("derived.responses_per_step", train_batch * sel(_A + "rollout.n")),
        ("derived.optimizer_steps_per_step",
         train_batch // sel(_A + "actor.ppo_mini_batch_size") * sel(_A + "actor.ppo_epochs")),
        ("derived.ray", f"RAY_ADDRESS={ray_address}" if ray_address else "local ray.init"),
        # every variable shipped to the Ray workers through ray_init.runtime_env (the reward timeout, FP8's
        # NVTE_FP8_BLOCK_SCALING_FP32_SCALES, the CPU platform's settings, ...)
        ("derived.worker_env", dict(sel("ray_kwargs.ray_init.runtime_env.env_vars") or {})),
    ]


def _check_verl_version(_) -> Check:
    """The installed verl against the one the plugin was written for, before anything composes.

    Another verl is a ``WARN`` here, the first line on screen, not a failure: with it the plugin stays inactive, so a
    job that needs the plugin (``loss_mode=stapo``, a ``token_mask``, the CPU platform) fails at the step that needs
    it, naming both versions, while a job of verl's own losses starts as on the verl it was written for.

    Raises:
        nothing (the mismatch is reported as a warning).
    """
    from stapo_verl.integration.verl_0_9_1 import VERL_VERSION, allowed_anyway
    from stapo_verl.launch.errors import installed_verl_problems, verl_gate_message

    problems = installed_verl_problems()
    if not problems:
        return Check(f"verl {VERL_VERSION}")
    gate = verl_gate_message(problems, allowed_anyway())
    if gate is None:
        return Check(f"{problems[0]} (loaded anyway: STAPO_ALLOW_UNSUPPORTED_VERL=1)", "WARN")
    return Check(gate, "WARN")


def _check_data(config) -> Check:
    """:func:`stapo_verl.launch.data_checks.check_data` on the files present here (tokenizer: a local model.path).

    Raises:
        stapo_verl.launch.data_checks.DataCheckError: naming the file, the column or value and the fix.
    """
    from stapo_verl.launch.data_checks import check_data

    report = check_data(config, recipe_rules.local_model(config))
    return Check(report.detail, report.status, report.warnings)


def _memory_plan(config) -> Check:
    """The memory plan of the composed config on the recipes' GPU (:mod:`stapo_verl.launch.memory_plan`), printed
    phase by phase.

    Returns:
        SKIPPED for an FSDP actor or a model whose shape is unknown here.
    Raises:
        RecipeRuleError: a phase exceeds :data:`~stapo_verl.launch.memory_plan.DEFAULT_GPU_GB` (the plan is the
            message, with the options that lower it).
    """
    from stapo_verl.launch.memory_plan import plan_for_config

    plan, why = plan_for_config(config)
    if plan is None:
        return Check(f"not planned: {why}", "SKIPPED")
    text = "\n".join(plan.lines())
    if not plan.fits:
        raise recipe_rules.RecipeRuleError(text)
    return Check(f"peak {plan.peak.name} {plan.peak.total_gb:.1f} of {plan.gpu_gb:.0f} GB\n{text}")


def _preflight(config) -> Check:
    """:func:`stapo_verl.launch.preflight.as_dry_run_check`: what the launch's preflight would refuse, as warnings
    (the GPU checks need the cluster's node). Raises nothing."""
    from stapo_verl.launch.preflight import as_dry_run_check

    return as_dry_run_check(config)


def _format_exception(exc: BaseException) -> str:
    from stapo_verl.launch.errors import config_cause, config_error_message

    refused = config_cause(exc)
    if getattr(refused, "key", None) is not None:  # a config value refused: the default and the fix, one line
        return f"{type(refused).__module__}.{type(refused).__qualname__}: {config_error_message(refused)}"
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

    Never raises for a config problem (the plugin's version error included): failures are recorded in the returned
    report (``ok=False``) and printed with the verl / Hydra / OmegaConf message. Source: verl 0.9.1
    ``verl.trainer.main_ppo.main``, ``run_ppo`` and ``TaskRunnerV1.run``, which it runs up to ``ray.init`` /
    ``transfer_queue.init``.

    Args:
        overrides: Hydra overrides, exactly as passed to ``python -m verl.trainer.main_ppo``.
        out: stream for the report (default ``sys.stdout``).
    """
    out = out or sys.stdout
    report = DryRunReport()
    derived: list[tuple[str, Any]] = []

    def emit(line: str) -> None:
        print(line, file=out, flush=True)

    def step(name: str, fn: Callable[[Any], str | Check]) -> bool:
        try:
            res = fn(report.config)
        except (Exception, IncompatibleVerlError) as exc:  # noqa: BLE001  (every failure is reported, then stop)
            report.ok = False
            report.steps.append((name, "FAIL", _format_exception(exc)))
            emit(f"{PREFIX} FAIL  {name}")
            emit(_format_exception(exc))
            if os.environ.get("STAPO_DRYRUN_TRACEBACK"):
                emit("".join(traceback.format_exception(exc)))
            return False
        res = res if isinstance(res, Check) else Check(str(res))
        report.steps.append((name, res.status, res.detail))
        emit(f"{PREFIX} {res.status:<5} {name}: {res.detail}")
        for w in res.warnings:
            report.steps.append((name, "WARN", w))
            emit(f"{PREFIX} WARN  {w}")
        if res.value is not None:
            derived.append(res.value)
        return True

    def compose(_) -> str:
        report.config = compose_config(overrides)
        return f"verl's trainer config with {len(overrides)} overrides"

    def override_types(config) -> str:
        from stapo_verl.launch.override_types import check_composed

        return f"{check_composed(overrides, config)} overrides of a typed key, each of its type"

    steps: tuple[tuple[str, Callable[[Any], str | Check]], ...] = (
        ("verl version", _check_verl_version),
        ("hydra compose (main_ppo's config)", compose),
        ("override types (each value of the type its key wants; sizes, lengths, counts > 0)", override_types),
        ("plugin import + entry point + verl version", _check_plugin),
        ("main_ppo.main: auto_set_device + validate_config + run_ppo up to ray.init", lambda c: _run_main(c, report)),
        ("loss mode registered", _check_loss_registered),
        ("TaskRunnerV1.run up to transfer_queue.init", _run_task_runner),
        ("worker config dataclasses", _build_worker_configs),
        ("recipe checks (Megatron/vLLM start-up rules)", recipe_rules.recipe_checks),
        ("memory plan (per GPU and phase)", _memory_plan),
        ("training length (epochs x rows, last-step checkpoint/validation)", recipe_rules.check_training_length),
        ("HFModelConfig + model shape", _build_model_config),
        ("stop tokens reaching the rollout", recipe_rules.check_stop_tokens),
        ("data files (columns, data sources, prompt lengths)", _check_data),
        ("preflight, GPU-free checks (trackers, paths, stop-token folder)", _preflight),
        ("Ray resource pools, Megatron/vLLM init", lambda _: Check("need GPUs and a Ray cluster", "SKIPPED")),
    )
    if not all(step(name, fn) for name, fn in steps):  # stops at the first failure
        emit(f"{PREFIX} FAILED: the config would not start (see the message above)")
        return report

    report.settings = _summary(report.config) + derived
    emit(f"{PREFIX} resolved key settings:")
    width = max(len(k) for k, _ in report.settings)
    for k, v in report.settings:
        emit(f"  {k:<{width}} = {v}")
    emit(f"{PREFIX} OK")
    return report


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``python -m stapo_verl.launch.dryrun <hydra overrides...>``; returns the exit status (raises
    nothing for a config problem)."""
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
