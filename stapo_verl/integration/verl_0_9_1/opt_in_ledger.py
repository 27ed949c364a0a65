"""The ledger of the plugin's options (verl 0.9.1's private API they touch), apart from the masked job's
(:data:`stapo_verl.integration.verl_0_9_1.PATCHES`): a job that asks only for the mask neither loads nor checks it.

One tuple per option; :func:`check_opt_in` checks an option's entries when a job
asks for it (on the driver, before Ray), with the same rules as the masked job's gate:

* ``diagnostics``: the trainer's wrappers (``policy_loss.mask_statistics`` / ``dump_tokens``; :mod:`.trainer`);
* ``extras``: the worker side of the options around the mask pre-pass (the mini-batch index of ``s2t_random`` and
  the dump, ``stats_source=current_minibatch``, the LM-head gradient norm; :mod:`.training_worker`);
* ``reproducible``: ``+trainer.reproducible=True`` (:mod:`.determinism`);
* ``dryrun``: what the dry-run (:mod:`stapo_verl.launch.dryrun`) calls of verl's start-up.
"""

from __future__ import annotations

from types import MappingProxyType

from stapo_verl.integration import verl_0_9_1 as gate
from stapo_verl.ledger import Patch, ledger_mismatches

DIAGNOSTICS: tuple[Patch, ...] = (
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
)

EXTRAS: tuple[Patch, ...] = (
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
)

REPRODUCIBLE: tuple[Patch, ...] = (
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
)

DRYRUN: tuple[Patch, ...] = (
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
)

#: option → its entries
OPT_IN_PATCHES = MappingProxyType({"diagnostics": DIAGNOSTICS, "extras": EXTRAS, "reproducible": REPRODUCIBLE,
                                   "dryrun": DRYRUN})


def all_patches() -> tuple[Patch, ...]:
    """The masked job's :data:`~stapo_verl.integration.verl_0_9_1.PATCHES` and every option's entries, in order."""
    return gate.PATCHES + tuple(p for patches in OPT_IN_PATCHES.values() for p in patches)


def check_opt_in(name: str, asked_by: str) -> None:
    """The gate of one option (a key of :data:`OPT_IN_PATCHES`), run on the driver when a job asks for it.

    Raises:
        IncompatibleVerlError: as :func:`.unsupported.check_verl`, for the option's entries.
        KeyError: ``name`` is no option.
    """
    problems = ledger_mismatches(OPT_IN_PATCHES[name], f"verl {gate.VERL_VERSION}")
    if problems:
        from stapo_verl.integration.verl_0_9_1.unsupported import raise_unless_allowed

        raise_unless_allowed(problems, asked_by)


#: the post-import hooks of each option of :data:`.job.OPT_INS` (installed only when a job asks for it)
OPT_IN_HOOKS = MappingProxyType({
    "diagnostics": (("verl.trainer.ppo.v1.trainer_base", "trainer:patch_trainer_base"),),
    "reproducible": (("verl.experimental.agent_loop.agent_loop", "determinism:patch_agent_loop"),
                     ("verl.trainer.ppo.v1.trainer_base", "determinism:patch_trainer_base")),
})


def install_opt_in(name: str) -> None:
    """Install the wrappers of the option ``name`` (a key of :data:`OPT_IN_HOOKS`) as post-import hooks
    (idempotent). The plugin's installer calls it at load for the options :data:`.job.OPT_INS_ENV` names.

    Raises:
        KeyError: ``name`` is not an option.
    """
    from wrapt import register_post_import_hook

    for module, hook in OPT_IN_HOOKS[name]:
        register_post_import_hook(f"{gate.__name__}.{hook}", module)
