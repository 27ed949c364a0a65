"""Every touch of verl 0.9.1's private API, in one place: the ledger and the version gate (install: :mod:`.installer`).

The plugin is a backport of an extension point verl does not have yet (a policy-token-mask registry, the mask
pre-pass in ``TrainingWorker.train_batch``, ``ppo_loss`` applying the mask to the policy-gradient term; see
``upstream/``). Until verl ships it, the plugin reaches into the private symbols listed in :data:`PATCHES`. Each
entry says why, what upstream replaces it, when to remove it, and the fingerprint of the verl 0.9.1 symbol it was
written against (signature; for a function whose body the plugin copies, the sha256 of its source).

The gate runs at plugin load (:func:`.installer.install`), before anything is patched. It reads verl's version and the
fingerprints from verl's source files (``ast``; nothing heavy is imported). It is scoped to the jobs that use the
plugin, because the plugin is loaded by ``import verl`` in every process of every verl job of the environment:

* the verl of :data:`PATCHES`: everything is installed;
* any other verl (version or a fingerprint differs): one warning line naming both versions, and nothing in verl is
  patched (nor is the CPU platform registered: it patches verl's private API too). ``import verl`` and every job
  that asks for neither ``loss_mode=stapo`` nor a ``token_mask`` run exactly as without the plugin. Through public
  registration APIs only (Hydra's ``ConfigStore``, verl's ``register_policy_loss``), a job that asks for the plugin
  fails naming both versions and the override: when verl builds its config (``StapoPolicyLossConfig``, the
  ``policy_loss._target_`` of the plugin's actor options that the recipes select, checks :func:`installed`), or, for
  ``loss_mode=stapo`` on verl's own ``PolicyLossConfig`` (verl 0.9 validates ``loss_mode`` nowhere before), at the
  first call of the registered ``stapo`` loss;
* ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: everything is installed anyway, after a loud warning listing every difference.

:class:`IncompatibleVerlError` derives from ``BaseException`` (like ``SystemExit``) on purpose: verl's plugin loader
(the ``verl.plugins`` entry-point loop in ``verl/__init__.py``) catches every ``Exception`` and logs it at DEBUG
level, so a job that asks for the plugin must not get an error any ``except Exception`` on its way could turn into a
silently missing plugin. Ray hands it to the driver as a ``RayTaskError`` like any other.
"""

from __future__ import annotations

import logging
import os
import warnings

from stapo_verl.ledger import ALLOW_ENV, Patch

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"


class IncompatibleVerlError(BaseException):
    """A job asks for the plugin (``loss_mode=stapo`` or a ``token_mask``), but the installed verl is not the one the
    plugin's private-API patches were written for.

    A ``BaseException`` so that verl's plugin loader, which catches ``Exception``, cannot hide it.
    """


_REMOVE = "when the installed verl contains the upstream PR named here (then drop the plugin's backport)"

PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.train_batch",
        action="replaced behind a dispatcher (training_worker.wrap_train_batch): a worker with a pre-pass "
        "(prepare_batch_fn or policy_token_mask_fn) runs stapo_verl.core.engine_workers.TrainingWorker.train_batch, "
        "the series' method (this body plus the pre-passes inside engine.train_mode), and with the plugin's mask "
        "its diagnostics around it; any other worker: verl's method, its own arguments and result",
        why="the pre-passes run once per optimizer mini-batch inside the engine's train mode, before the engine "
        "counts the mini-batch's tokens (batch_num_tokens) and splits it into micro-batches; the series' method is "
        "this body with those lines added, hence the source hash",
        upstream="PR A: the same method (upstream/build_series.py copies it into verl's class)",
        remove_when=_REMOVE,
        signature="(self, data: TensorDict) -> TensorDict",
        source_sha256="f771a9e32f61e691e074535ec8a0d1acf47e8d295d19b6945c3ccaff5e3e4282",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ppo_loss",
        action="rebound to training_worker.wrap_ppo_loss's dispatcher (training_worker.patch_engine_workers): "
        "stapo_verl.core.losses.ppo_loss when the actor config selects a token mask, verl's own ppo_loss (its "
        "arguments, its result) otherwise",
        why="ActorRolloutRefWorker.init_model builds the actor's loss as partial(ppo_loss, config=...) from this "
        "module-level name; the plugin's ppo_loss is verl 0.9.1's plus the mask on the policy-gradient term",
        upstream="PR A: verl.workers.utils.losses.ppo_loss applies policy_loss_mask itself",
        remove_when=_REMOVE,
        signature="from verl.workers.utils.losses import ppo_loss",
    ),
    Patch(
        symbol="verl.workers.utils.losses.ppo_loss",
        action="copied (not patched): stapo_verl.core.losses.ppo_loss is this function plus the mask",
        why="the copy must start from exactly this body, or the rebinding above would change verl's loss",
        upstream="PR A changes this function the same way",
        remove_when=_REMOVE,
        signature="(config: ActorConfig, model_output, data: TensorDict, dp_group=None)",
        source_sha256="d7a7f4ab82c8a092467633bb9951c45697f58f3abf4c47137a8bb80ee159bfa7",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.trainer_base.PPOTrainer._update_actor",
        action="wrapped (trainer.wrap_update_actor); for a job with a token mask, during the call the worker "
        "group's bound update_actor is wrapped on the instance (trainer.taking_payloads); any other job: verl's "
        "method, its own arguments and result",
        why="diagnostics in verl's trackers: ask the workers (batch.extra_info) for the mask histograms and, when a "
        "table is due, the silenced-token rows; take them out of the update's output metrics before "
        "reduce_metrics averages them; log them through the trainer's Tracking; add the collapse z-scores to the "
        "step's metrics. The wrapper relies on the body calling actor_rollout_wg.update_actor once before "
        "reduce_metrics, hence the source hash",
        upstream="none in the series: a follow-up RFC for a non-scalar metrics channel (e.g. a 'tables' field of "
        "the train output that PPOTrainer logs through Tracking), which would replace this wrapper",
        remove_when="when verl's trainer returns non-scalar worker outputs to Tracking itself",
        signature="(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta",
        source_sha256="82879aeff227214bcf355917b0105b2d2740e8c30457d921936aca38838a1e61",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.trainer_base.PPOTrainer._save_checkpoint",
        action="wrapped (trainer.wrap_save_checkpoint): for a job with a token mask, writes the diagnostics' "
        "driver state (collapse windows) into <default_local_dir>/global_step_<n>/stapo_driver_state.json before "
        "the body runs; any other job: verl's method only",
        why="the collapse early-warning's running windows live on the trainer; without them a resumed run scores "
        "differently from an uninterrupted one. The body writes latest_checkpointed_iteration.txt last and saves "
        "into default_local_dir/global_step_<n>, hence the source hash",
        upstream="none in the series: a checkpoint callback for driver-side state (verl's checkpoint_callback.on_save "
        "has no load counterpart in 0.9.1)",
        remove_when="when verl lets driver-side components save and load state with the trainer checkpoint",
        signature="(self)",
        source_sha256="fe53d9935ee20d695befacf07d9a7091e16550e12d72867c78a13e4595673c69",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.trainer_base.PPOTrainer._load_checkpoint",
        action="wrapped (trainer.wrap_load_checkpoint): for a job with a token mask, after the body, reads "
        "stapo_driver_state.json of the folder it resumed from; any other job: verl's method only",
        why="the counterpart of the _save_checkpoint entry; the body sets global_steps from the folder name, hence "
        "the source hash",
        upstream="as the _save_checkpoint entry",
        remove_when="as the _save_checkpoint entry",
        signature="(self)",
        source_sha256="686e8d6e0f6159310bfd25d39e41b2a71a57f8c0d421deffe35507a176b14ec9",
    ),
    Patch(
        symbol="verl.workers.engine.fsdp.transformer_impl.FSDPEngine.optimizer_step",
        action="wrapped on the engine instance for the duration of one TrainingWorker.train_batch call "
        "(engine_grads.reading_lm_head_grad_norm); reads the LM-head gradient right after it",
        why="a collapse signal (LM-head gradient norm) verl does not report; the gradients exist only between the "
        "step and the zeroing when TrainingWorker.train_batch leaves engine.train_mode(). The pre-clip value is "
        "recovered from this body's clip_grad_norm_ coefficient, hence the source hash",
        upstream="none in the series: a per-module gradient-norm metric in the engines' optimizer_step",
        remove_when="when verl's engines report the output layer's gradient norm",
        signature="(self)",
        source_sha256="12157de690eeda8277d882dd9292ab9573de0cd11da16a89b988df1df26169b9",
    ),
    Patch(
        symbol="verl.workers.engine.megatron.transformer_impl.MegatronEngine.optimizer_step",
        action="wrapped on the engine instance for the duration of one TrainingWorker.train_batch call "
        "(engine_grads.reading_lm_head_grad_norm); reads the LM-head gradient right before it",
        why="as for FSDP; before optimizer.step() the output weight's main_grad is reduced over DP and not clipped",
        upstream="none in the series: a per-module gradient-norm metric in the engines' optimizer_step",
        remove_when="when verl's engines report the output layer's gradient norm",
        signature="(self)",
        source_sha256="1c126740dceee749297dced7e028921192190dea8095ac569ed7d12d9a2657a3",
    ),
    Patch(
        symbol="verl.workers.engine.base.BaseEngine.train_batch",
        action="relied on (not patched): calls self.optimizer_step() once, after forward_backward_batch",
        why="the optimizer_step wrappers above run inside it; a body that steps differently would read the "
        "gradient at the wrong time",
        upstream="as the optimizer_step entries",
        remove_when="with the optimizer_step entries",
        signature="(self, data: TensorDict, loss_function: Callable) -> Any",
        source_sha256="624bdd4d515d8bf65a9b2d1b9718fae1b57a3dc2ed01c9b5da4a214e06f5cc38",
    ),
    Patch(
        symbol="verl.experimental.agent_loop.agent_loop.AgentLoopWorker._run_agent_loop",
        action="wrapped (determinism.wrap_run_agent_loop): with trainer.reproducible=True, adds a per-request "
        "'seed' to sampling_params; any other job: verl's method, its own arguments and result",
        why="verl 0.9.1 seeds every request with rollout.seed + replica_rank under full_determinism (the n samples "
        "of a prompt are then one response) and none without it; the seed must depend on what the request is for "
        "(step, train/validation, data source, row, sample number: stapo_verl.core.seeding), the only place that "
        "knows all of them is this method (trajectory + session_id), and the body must pass sampling_params on "
        "unchanged, hence the source hash",
        upstream="none in the series (it is not STAPO's): a verl PR deriving SamplingParams.seed from the trajectory "
        "info in AgentLoopWorker, replacing the constant seed in vLLMHttpServer.generate",
        remove_when="when verl seeds each rollout request from its trajectory",
        signature="(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str, "
        "trace: bool=True, **kwargs) -> _InternalAgentLoopOutput",
        source_sha256="b374079bf2f017472626797a5e1f27928d1ce61c62fbbbb89162ce26134ee021",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.agent_loop_tq.AgentLoopWorkerTQ._run_prompt",
        action="relied on (not patched): passes session_id=i (the sample number) to _run_agent_loop",
        why="the per-request seed reads session_id; a body that numbers samples differently would seed the n "
        "samples of a prompt alike",
        upstream="as the _run_agent_loop entry",
        remove_when="with the _run_agent_loop entry",
        signature="(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool=False) -> None",
        source_sha256="ba6ad1731dfba06427719f697275cdc703704a445c7fc8f0c6ef9742f63071bb",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._select_prompt_uids",
        action="wrapped on the replay buffer instance that PPOTrainer._build_replay_buffer returns, for a job with "
        "trainer.reproducible=True (determinism.ordering, determinism.wrap_select_prompt_uids): sampleable prompts "
        "passed in submission order (self.prompt_global_steps, TransferQueue's key order) instead of as a set; "
        "the class keeps verl's method",
        why="verl's stable sort by step breaks ties in set iteration order, which differs between processes",
        upstream="none in the series: a verl PR sorting by (step, submission order)",
        remove_when="when verl's ReplayBuffer selects and orders batches deterministically",
        signature="(self, partition_id: str, sampleable_keys: set[str], batch_size: int) -> "
        "tuple[list[str], dict[str, dict], dict[str, int]]",
        source_sha256="eb9911d742bab112e0ce9911bbefdfcfdafec079c9c0d04788aa5164f51dc29d",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._materialize_batch",
        action="wrapped on the replay buffer instance, as the _select_prompt_uids entry "
        "(determinism.wrap_materialize_batch): the batch reordered by (prompt submission order, session_id, output "
        "index) through KVBatchMeta.reorder",
        why="verl materialises trajectories in the order they finished (timing), which decides the micro-batch "
        "split and the summation order of the update",
        upstream="as the _select_prompt_uids entry",
        remove_when="as the _select_prompt_uids entry",
        signature="(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict[str, dict]) "
        "-> KVBatchMeta",
        source_sha256="ee811eb53021abd8cd7d09df02f977f05d8c0af78a28aff4151f73e4374cee9d",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.trainer_base.PPOTrainer._build_replay_buffer",
        action="wrapped (determinism.wrap_build_replay_buffer): for a job with trainer.reproducible=True, the "
        "buffer verl built gets the two ReplayBuffer entries above on the instance (determinism.ordering); any "
        "other job: verl's buffer, untouched",
        why="the batch order is decided per job (trainer.reproducible), and the buffer gets only its own "
        "trainer_config section, not the job's config; the trainer that builds it has the job's config",
        upstream="as the _select_prompt_uids entry",
        remove_when="as the _select_prompt_uids entry",
        signature="(self) -> ReplayBuffer",
    ),
    Patch(
        symbol="verl.experimental.agent_loop.agent_loop.AgentLoopWorker.__init__",
        action="state kept on the instance: _stapo_request (job.JobRequest from self.config, read by the "
        "_run_agent_loop wrapper)",
        why="the per-request seed is decided per job (trainer.reproducible); the agent-loop worker lives as long as "
        "the job and holds its config",
        upstream="as the _run_agent_loop entry",
        remove_when="with the _run_agent_loop entry",
        signature="(self, config: DictConfig, llm_client: LLMServerClient, teacher_client: dict[str, "
        "LLMServerClient]=None, reward_loop_worker_handles: list[ray.actor.ActorHandle]=None)",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.train_mini_batch",
        action="relied on (not patched): calls train_batch once per optimizer mini-batch with "
        "update_lr_scheduler=True on the last one of the update and False before it",
        why="the mask's mini-batch index (MiniBatchCursor: s2t_random's seed, the token dump's rows, the "
        "diagnostics payload sent once per update) restarts after the call that carries update_lr_scheduler=True",
        upstream="none in the series (only the plugin's s2t_random seed, token dump and diagnostics need the "
        "index); it goes when verl's train_mini_batch passes its loop index to train_batch",
        remove_when="when verl's train_mini_batch passes the mini-batch index to train_batch",
        signature="(self, data: TensorDict) -> TensorDict",
        source_sha256="db1122bf51bb9e713a3c0679fb21f0416c1e12817c62338e7ab6e87c703dcf12",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.infer_batch",
        action="relied on (not called): the engine keys it injects before engine.infer_batch "
        "(use_remove_padding, use_dynamic_bsz, max_token_len_per_gpu, micro_batch_size_per_gpu, use_fused_kernels)",
        why="stats_source=current_minibatch runs the engine's forward on the mini-batch itself "
        "(training_worker.current_forward_keys copies these key names, at the training budget): the pre-pass runs "
        "inside train_batch on every rank, "
        "where the worker's infer_batch (a dispatched method that also post-processes and moves the output to "
        "the CPU) cannot be called",
        upstream="none in the series (current_minibatch is an option of the plugin only)",
        remove_when="when current_minibatch moves upstream or is dropped",
        signature="(self, data: TensorDict) -> TensorDict",
        source_sha256="8e6ae2d7c16d4f1f22e4d6fd03344f8518b1145f5438cd3fb5ab96d3fdad5767",
    ),
    Patch(
        symbol="verl.workers.engine.base.BaseEngine.eval_mode",
        action="called (stapo_verl.minibatch.current_policy): eval_mode(disable_auto_offload=True)",
        why="the current policy's log-prob and entropy, without dropout and without offloading the weights the "
        "next engine.train_batch needs",
        upstream="none in the series (current_minibatch is an option of the plugin only)",
        remove_when="when current_minibatch moves upstream or is dropped",
        signature="(self, **kwargs)",
    ),
    Patch(
        symbol="verl.workers.engine.base.BaseEngine.infer_batch",
        action="called (stapo_verl.minibatch.current_policy): infer_batch(td, loss_function=None) with "
        "calculate_entropy=True; reads the output's log_probs and entropy",
        why="as eval_mode",
        upstream="none in the series (current_minibatch is an option of the plugin only)",
        remove_when="when current_minibatch moves upstream or is dropped",
        signature="(self, data: TensorDict, loss_function: Optional[Callable]=None) -> Any",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.init_model",
        action="wrapped (training_worker.wrap_init_model): after verl's body, when the actor's policy_loss asks for "
        "a token mask (job.asks_for_mask), the actor config is built from self.config.actor "
        "(omega_conf_to_dataclass, as verl builds it) and the actor's policy_token_mask_fn is "
        "StapoPrepareBatch(config, ...); relies on verl building the actor's loss as partial(ppo_loss, "
        "config=actor_config) from the module-level name ppo_loss, and distillation's as "
        "partial(distillation_ppo_loss, ...)",
        why="the worker receives its actor config as an argument (the series' pre-pass contract); a token_mask "
        "with a loss that is not the plugin's ppo_loss (distillation) is refused here",
        upstream="PR A: init_model sets self.actor.policy_token_mask_fn = partial(apply_policy_token_mask, "
        "actor_config) when token_mask is set",
        remove_when=_REMOVE,
        signature="(self)",
        source_sha256="8bf2619c9dbfa87754b49584fbb66f75939bbd485998d217a970859a1c9597cb",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.set_loss_fn",
        action="replaced behind a dispatcher (training_worker.replace_set_loss_fn, keeping verl's @register "
        "attributes): stapo_verl.core.engine_workers.TrainingWorker.set_loss_fn(loss_fn, prepare_batch_fn=None) "
        "once a pre-pass is passed or set; verl's method otherwise",
        why="the pre-pass contract of the series: the caller's prepare_batch_fn(data, *, engine, dp_group) runs on "
        "each optimizer mini-batch, before the actor's policy_token_mask_fn (core.losses.run_prepare_batch); the "
        "state it writes (prepare_batch_fn, policy_token_mask_fn) is the series' TrainingWorker attributes",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.set_loss_fn",
        action="replaced behind a dispatcher (training_worker.replace_actor_set_loss_fn): "
        "stapo_verl.core.engine_workers.ActorRolloutRefWorker.set_loss_fn(loss_fn, prepare_batch_fn=None) once a "
        "pre-pass is passed or the actor has one; verl's method otherwise",
        why="a recipe or another plugin sets its own pre-pass through the worker; the actor's mask "
        "(policy_token_mask_fn) is not touched, so the two compose",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.__init__",
        action="state kept on the instance: _stapo_cursor (training_worker.MiniBatchCursor: mini-batch index, "
        "histograms and token rows of the update) and _stapo_tokenizer (the tokenizer for the token dump when "
        "model_config has none)",
        why="the wrapped train_batch is called once per mini-batch and needs the index and the rows of the earlier "
        "mini-batches of the same update; the worker instance is the only object that lives exactly as long",
        upstream="none in the series: the cursor serves the plugin-only s2t_random seed, token dump and tables",
        remove_when="when verl's train_mini_batch passes the mini-batch index and the plugin keeps no per-update rows",
        signature="(self, config: TrainingWorkerConfig)",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.trainer_base.PPOTrainer.__init__",
        action="state kept on the instance: _stapo_request (job.JobRequest, what the job asks of the plugin, decided "
        "once from the trainer's config) and, for a job with a token mask, _stapo_diagnostics "
        "(diagnostics.driver.DriverDiagnostics: the collapse early-warning's windows, the tables' schedule), saved "
        "and restored with the checkpoint",
        why="the driver-side diagnostics live as long as the trainer and are read by the wrapped _update_actor, "
        "_save_checkpoint and _load_checkpoint",
        upstream="none in the series (the diagnostics are the plugin's)",
        remove_when="never while the plugin has driver-side diagnostics",
        signature="(self, config: DictConfig)",
    ),
    Patch(
        symbol="verl.trainer.main_ppo.main",
        action="relied on (called by the dry-run, stapo_verl.launch.dryrun, with ray.init and ray.is_initialized "
        "replaced by unittest.mock for the call): validates and resolves the config, then calls ray.init",
        why="the dry-run runs verl's own start-up up to the point where it would start Ray (ray.is_initialized reads "
        "False so verl builds the ray.init arguments as for a fresh driver; ray.init records them and ends the call)",
        upstream="none in verl 0.9.1: run_ppo builds the ray.init arguments and calls ray.init in one function; a verl "
        "function returning those arguments (what run_ppo would pass) would replace both mocks",
        remove_when="never while the dry-run runs verl's start-up",
        signature="(config)",
        source_sha256="02d2b3ef6012de200e8349455e25c304d227aeff66e861e2a60752482b5d252f",
    ),
    Patch(
        symbol="verl.trainer.main_ppo.TaskRunnerV1.run",
        action="relied on (called by the dry-run on TaskRunnerV1.__ray_actor_class__(), with transfer_queue.init "
        "replaced by unittest.mock for the call): selects the trainer class and resolves the config, then calls "
        "transfer_queue.init",
        why="the dry-run checks the worker/trainer selection verl would make, without Ray or TransferQueue "
        "(transfer_queue.init records the call and ends it before any trainer is built)",
        upstream="none in verl 0.9.1: run selects the trainer, resolves the config and starts TransferQueue in one "
        "method; a verl function doing the first two would replace the mock",
        remove_when="never while the dry-run runs verl's start-up",
        signature="(self, config: DictConfig)",
        source_sha256="661a86160739a0dcc1014f71164b707641d7a59b6edc05b4c69a39cb56758fc0",
    ),
    Patch(
        symbol="verl.utils.config.validate_config",
        action="wrapped (driver_config.wrap_validate_config); a job without a token mask: verl's function, its own "
        "arguments and result, the config untouched",
        why="on the driver, before verl builds any config object: point policy_loss._target_ at the plugin's "
        "config class when loss_mode=stapo or a token_mask is set, then check the keys the mask depends on",
        upstream="PR A adds PolicyLossConfig.token_mask (declared in actor.yaml, validated in __post_init__), so "
        "no _target_ is needed; PR B adds s2t_tau_p/s2t_entropy_quantile, validated inline in __post_init__ when a "
        "token_mask is set, as dro_beta is. The other "
        "checks have no upstream counterpart: there a batch without the declared fields raises a KeyError naming "
        "them, and distillation works because distillation_ppo_loss calls the masked ppo_loss",
        remove_when=_REMOVE,
        signature="(config: DictConfig, use_reference_policy: bool, use_critic: bool) -> None",
    ),
    Patch(
        symbol="verl.trainer.main_ppo.run_ppo",
        action="wrapped (driver_config.wrap_run_ppo); a job without a token mask: verl's function, its own "
        "arguments and result, the config untouched",
        why="the same _target_ fill for entry points that call run_ppo without validate_config on the driver "
        "(e.g. verl.experimental.fully_async_policy)",
        upstream="nothing: with PR A there is no _target_ to fill",
        remove_when=_REMOVE,
        signature="(config, task_runner_class) -> None",
    ),
)


def _verl_root() -> str:
    import verl

    return os.path.dirname(os.path.abspath(verl.__file__))


def installed_verl_version() -> str:
    """verl's own version string (``verl/version/version``, what ``verl.__version__`` reads)."""
    with open(os.path.join(_verl_root(), "version", "version"), encoding="utf-8") as f:
        return f.read().strip()


def fingerprint(symbol: str) -> tuple[str | None, str | None]:
    """``(signature, source sha256)`` of a verl symbol, read from verl's source with ``ast`` (nothing imported).

    Returns ``(None, None)`` when the module or the symbol does not exist. A name bound by ``from … import`` gives
    that import statement as its signature and no hash.
    """
    from stapo_verl.ledger import fingerprint as source_fingerprint

    return source_fingerprint(symbol)


def mismatches() -> list[str]:
    """Every difference between the installed verl and what :data:`PATCHES` was written for, in ledger order.

    The version comes first when it differs; then one line per symbol whose signature or source differs.
    """
    problems = []
    found = installed_verl_version()
    if found != VERL_VERSION:
        problems.append(f"verl {found} is installed; stapo-verl's integration is written for verl {VERL_VERSION}")
    from stapo_verl.ledger import ledger_mismatches

    return problems + ledger_mismatches(PATCHES, f"verl {VERL_VERSION}")


def allowed_anyway() -> bool:
    """True when ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: load the whole integration on a verl it was not written for."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def describe_mismatch(problems: list[str]) -> str:
    """``stapo-verl <version> is written for verl 0.9.1; found verl <found>`` and, when the version alone does not
    explain it, the first symbol of :data:`PATCHES` that differs.

    Args:
        problems: the output of :func:`mismatches` (non-empty).
    """
    symbols = [p for p in problems if not p.startswith("verl ")]
    return (
        f"stapo-verl {_plugin_version()} is written for verl {VERL_VERSION}; found verl {installed_verl_version()}"
        + (f" (first differing symbol: {symbols[0]})" if symbols and len(symbols) == len(problems) else "")
    )


def unsupported_verl_error(asked_by: str, problems: list[str] | None = None) -> IncompatibleVerlError:
    """The error for a job that asks for the plugin on a verl the plugin was not written for (returned, not raised).

    Args:
        asked_by: what asked for the plugin, e.g. ``"actor_rollout_ref.actor.policy_loss.loss_mode='stapo'"``.
        problems: :func:`mismatches` when already computed.

    Returns:
        :class:`IncompatibleVerlError` naming ``asked_by``, both verl versions (and the first differing symbol), the
        fix and the override ``STAPO_ALLOW_UNSUPPORTED_VERL=1``.
    """
    problems = mismatches() if problems is None else problems
    return IncompatibleVerlError(
        f"{asked_by} needs stapo-verl's verl integration, which is not loaded: {describe_mismatch(problems)}. "
        f"Install verl=={VERL_VERSION}; or, at your own risk, set {ALLOW_ENV}=1 in every process of the job (the "
        "driver and the Ray workers) to load it anyway."
    )


def _inactive_warning(problems: list[str]) -> str:
    return (
        f"{describe_mismatch(problems)}: the plugin stays inactive (nothing in verl is patched, no CPU platform); "
        f"jobs without loss_mode=stapo or a token_mask run as without it, jobs with them fail. Install "
        f"verl=={VERL_VERSION}, or set {ALLOW_ENV}=1 to load it anyway."
    )


def _warn_override(problems: list[str]) -> None:
    message = f"{describe_mismatch(problems)}. Loading it anyway because {ALLOW_ENV}=1, at your own risk"
    warnings.warn(f"{message}. All differences: {problems}", stacklevel=3)
    logger.warning("%s.", message)


def check_verl(asked_by: str = "this job") -> None:
    """The gate: raise unless the installed verl matches :data:`PATCHES` or the override is set.

    Args:
        asked_by: what needs the integration (named first in the error).

    Raises:
        IncompatibleVerlError: the version or a fingerprint differs and ``STAPO_ALLOW_UNSUPPORTED_VERL`` is not
            ``1`` (:func:`unsupported_verl_error`). With the override the call warns loudly (``warnings`` and the
            log, every difference listed) and returns.
    """
    problems = mismatches()
    if not problems:
        return
    if allowed_anyway():
        _warn_override(problems)
        return
    raise unsupported_verl_error(asked_by, problems)


def installed() -> bool:
    """Whether :func:`.installer.install` put the integration in place in this process.

    Read from verl itself: the ``verl.utils.config.validate_config`` wrapper is the first, eager patch of the full
    install and carries the ``__stapo_integration__`` mark; on a verl the plugin was not written for it is absent.
    """
    import verl.utils.config as verl_config

    return bool(getattr(verl_config.validate_config, "__stapo_integration__", False))


def unsupported_verl_policy_loss(*args, **kwargs):
    """``loss_mode=stapo`` on a verl the plugin was not written for (registered with verl's public
    ``verl.trainer.ppo.core_algos.register_policy_loss``; verl looks the loss up at its first call in the actor).

    Raises:
        IncompatibleVerlError: always (:func:`unsupported_verl_error`).
    """
    raise unsupported_verl_error("actor_rollout_ref.actor.policy_loss.loss_mode='stapo'")


def _plugin_version() -> str:
    from stapo_verl import __version__

    return __version__
