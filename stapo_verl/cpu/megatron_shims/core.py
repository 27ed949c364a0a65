"""megatron-core 0.16.1 on the CPU over gloo: the per-site shims.

Each shim below names the megatron-core site it covers; all are idempotent and edit no installed file.

==========================================  =====================================================================
shim                                        sites (megatron/core/…, 0.16.1)
==========================================  =====================================================================
:func:`_proxy_torch` (``TorchOnCPU`` as     ``torch.cuda.current_device()``: tensor_parallel/layers.py:261, 552,
the modules' global ``torch``)              597, 607, 873, 899, 1197, 1218; mappings.py:91, 141, 148, 181, 442;
                                            tensor_parallel/utils.py:70, 91; rotary_pos_embedding.py:78, 162, 297;
                                            param_and_grad_buffer.py:783, 800, 806; p2p_communication.py:190-202,
                                            313, 321; attention.py:430; dot_product_attention.py:132;
                                            distrib_optimizer.py:791; optimizer.py:1141; utils.py:631.
                                            ``torch.cuda.synchronize()``: p2p_communication.py:242 (runs whenever
                                            ``variable_seq_lengths=True``, which verl sets), 398.
                                            Literal ``device="cuda"``: schedules.py:596, 983, 2138;
                                            clip_grads.py:90, 103, 115, 174, 207; optimizer.py:473, 481, 485, 907;
                                            param_and_grad_buffer.py:768; utils.py:1207.
                                            CUDA RNG: tensor_parallel/random.py:235-238 (tracker ``add``), 422
                                            (``model_parallel_cuda_manual_seed``).
                                            Checkpoints (dist_checkpointing/…): strategies/filesystem_async.py:230,
                                            fully_parallel.py:272/281, async_utils.py:165/212/604,
                                            state_dict_saver.py:204/252, tensor_aware_state_dict.py:304,
                                            exchange_utils.py:104/110/326.
:func:`_cpu_rng_state`                      random.py ``_get_cuda_rng_state``/``_set_cuda_rng_state`` (used by
                                            ``CudaRNGStatesTracker.fork``, e.g. dot_product_attention.py:217 and
                                            the vocab-parallel embedding init) → torch's CPU generator.
:func:`_cuda_type_names`                    ``Tensor.type()`` string asserts: clip_grads.py:167,
                                            optimizer.py:671/690 (``Float16OptimizerWithFloat16Params.__init__``),
                                            distrib_optimizer.py:361/420/582 (``DistributedOptimizer.__init__``).
:func:`_thd_attention`                      dot_product_attention.py:153 (``packed_seq_params`` assert): verl
                                            feeds packed THD micro-batches; replaced by a block-diagonal causal
                                            mask built from ``cu_seqlens_q(_padded)``.
:func:`_no_fused_softmax`                   fusions/fused_softmax.py:238 ``is_kernel_available`` (bf16/fp16 →
                                            ``scaled_masked_softmax_cuda`` import at :262→357): always False.
:func:`_fresh_torch_adam_state`             optimizer/distrib_optimizer.py:640-642 ``state_dict`` asserts on a
                                            fresh torch Adam (no TE/Apex): checkpoint *load* (resume).
==========================================  =====================================================================

Not shimmed: sequence parallelism with the local spec (transformer/torch_norm.py:32 asserts); CPU runs set
``override_transformer_config.sequence_parallel=False`` (mbridge turns it on whenever TP > 1,
``mbridge/core/llm_bridge.py:76``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from types import MappingProxyType

import torch

from stapo_verl.cpu.megatron_shims.torch_proxy import install_into

# megatron-core modules whose functions call torch.cuda.* / device="cuda" on the engine's code path.
PROXIED_MODULES = (
    "megatron.core.parallel_state",
    "megatron.core.utils",
    "megatron.core.rerun_state_machine",
    "megatron.core.tensor_parallel.layers",
    "megatron.core.tensor_parallel.mappings",
    "megatron.core.tensor_parallel.random",
    "megatron.core.tensor_parallel.utils",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.gpt.gpt_model",
    "megatron.core.transformer.attention",
    "megatron.core.transformer.dot_product_attention",
    "megatron.core.transformer.module",
    "megatron.core.transformer.transformer_layer",
    "megatron.core.transformer.utils",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.distributed.distributed_data_parallel",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.utils",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.optimizer.grad_scaler",
    # checkpoint save/load (verl's MegatronCheckpointManager → dist_checkpointing)
    "megatron.core.dist_checkpointing.tensor_aware_state_dict",
    "megatron.core.dist_checkpointing.exchange_utils",
    "megatron.core.dist_checkpointing.strategies.async_utils",
    "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "megatron.core.dist_checkpointing.strategies.fully_parallel",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver",
)


def _proxy_torch() -> None:
    for name in PROXIED_MODULES:
        install_into(importlib.import_module(name))


def _drop_cpu_rng_warning(record: logging.LogRecord) -> bool:
    return record.getMessage() != "CPU RNG state changed within GPU RNG context"


def _cpu_rng_state() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    if getattr(mrandom._get_cuda_rng_state, "_stapo_cpu", False):
        return

    def _get_cuda_rng_state(device="cuda", clone=False, graph_safe=False):
        """CPU stand-in for ``random.py:_get_cuda_rng_state``: torch's CPU generator state (a ByteTensor)."""
        return torch.get_rng_state()

    def _set_cuda_rng_state(new_state, device=-1, graph_safe=False):
        """CPU stand-in for ``random.py:_set_cuda_rng_state``."""
        torch.set_rng_state(new_state)

    _get_cuda_rng_state._stapo_cpu = _set_cuda_rng_state._stapo_cpu = True
    # fork() (random.py:265) warns when the CPU generator moved inside the context; here the forked generator *is*
    # the CPU one, so that warning would fire on every fork. (addFilter adds a filter once.)
    logging.getLogger("megatron.core.tensor_parallel.random").addFilter(_drop_cpu_rng_warning)
    mrandom._get_cuda_rng_state = _get_cuda_rng_state
    mrandom._set_cuda_rng_state = _set_cuda_rng_state


#: what ``Tensor.type()`` returns on CUDA for the dtypes megatron-core's asserts compare against (read-only)
_CUDA_TYPE_NAMES = MappingProxyType({torch.float32: "torch.cuda.FloatTensor", torch.float16: "torch.cuda.HalfTensor",
                                     torch.bfloat16: "torch.cuda.BFloat16Tensor"})


@contextlib.contextmanager
def _cuda_type_names_ctx():
    """While active, ``cpu_tensor.type()`` returns the CUDA type name megatron-core's asserts compare against."""
    prev = torch.Tensor.type

    def type_as_cuda(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu" and self.dtype in _CUDA_TYPE_NAMES:
            return _CUDA_TYPE_NAMES[self.dtype]
        return prev(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_as_cuda
    try:
        yield
    finally:
        torch.Tensor.type = prev


def _scoped(fn):
    if getattr(fn, "_stapo_cpu", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _cuda_type_names_ctx():
            return fn(*args, **kwargs)

    wrapper._stapo_cpu = True
    return wrapper


def _cuda_type_names() -> None:
    """Scope the ``Tensor.type()`` rename to exactly the three functions holding the asserts (no global mode)."""
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    clip_grads.clip_grad_by_total_norm_fp32 = _scoped(clip_grads.clip_grad_by_total_norm_fp32)
    optimizer.clip_grad_by_total_norm_fp32 = clip_grads.clip_grad_by_total_norm_fp32  # bound by name at :50
    f16 = optimizer.Float16OptimizerWithFloat16Params
    f16.__init__ = _scoped(f16.__init__)
    dist = distrib_optimizer.DistributedOptimizer
    dist.__init__ = _scoped(dist.__init__)


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Megatron-convention mask (True = masked) for packed sequences: causal within each segment, nothing across.

    Args:
        cu_seqlens: (n+1,) int cumulative sequence offsets (``PackedSeqParams.cu_seqlens_q(_padded)``).
        total: packed length t (tokens past ``cu_seqlens[-1]`` get their own segment).
    Returns:
        (1, 1, t, t) bool.
    """
    pos = torch.arange(total, device=cu_seqlens.device)
    seg = torch.bucketize(pos, cu_seqlens[1:].to(pos.dtype), right=True)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    return ~allowed[None, None]


def _thd_attention() -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    orig = DotProductAttention.forward
    if getattr(orig, "_stapo_cpu", False):
        return

    @functools.wraps(orig)
    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is None:
            return orig(self, query, key, value, attention_mask, attn_mask_type, attention_bias, None)
        if packed_seq_params.qkv_format != "thd":
            raise NotImplementedError(f"CPU DotProductAttention: qkv_format={packed_seq_params.qkv_format!r}")
        # attention.py:1066 squeezed the dummy batch dim: (t, np, hn) -> (t, 1, np, hn)
        query, key, value = (x.unsqueeze(1) if x.dim() == 3 else x for x in (query, key, value))
        cu = packed_seq_params.cu_seqlens_q_padded
        cu = packed_seq_params.cu_seqlens_q if cu is None else cu
        mask = block_causal_mask(cu, query.shape[0])
        out = orig(self, query, key, value, mask, attn_mask_type, attention_bias, None)
        return out  # (t, 1, hp); attention.py:1189 reshapes

    forward._stapo_cpu = True
    DotProductAttention.forward = forward


def _no_fused_softmax() -> None:
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax

    if getattr(FusedScaleMaskSoftmax.is_kernel_available, "_stapo_cpu", False):
        return

    def is_kernel_available(self, mask, b, np, sq, sk):
        """No CUDA softmax kernel on the CPU: always use megatron's torch softmax path."""
        return False

    is_kernel_available._stapo_cpu = True
    FusedScaleMaskSoftmax.is_kernel_available = is_kernel_available


def _fresh_torch_adam_state() -> None:
    """Resume with torch's Adam (no TE/Apex: always on the CPU) under the distributed optimizer.

    ``DistributedOptimizer.state_dict`` (distrib_optimizer.py:640-642) reads the step from the inner torch optimizer's
    per-parameter state and asserts exactly one value; a freshly built optimizer — the one verl's checkpoint manager
    builds the load template from (``megatron_checkpoint_manager.py:408``) — has no state yet. Before the original
    runs, such an optimizer gets the state torch's Adam would create lazily on its first step (``step`` 0, zero
    moments, via megatron's own ``init_state_fn``, optimizer/__init__.py:391); the checkpoint then overwrites it.
    """
    from megatron.core.optimizer import distrib_optimizer

    dist = distrib_optimizer.DistributedOptimizer
    orig = dist.state_dict
    if getattr(orig, "_stapo_cpu", False):
        return

    @functools.wraps(orig)
    def state_dict(self):
        inner = self.optimizer
        if (not distrib_optimizer.HAVE_APEX_OR_TE and isinstance(inner, torch.optim.Optimizer) and not inner.state
                and self.init_state_fn is not None):
            self.init_state_fn(inner, self.config)
            for st in inner.state.values():
                st.setdefault("step", torch.tensor(0.0))
        return orig(self)

    state_dict._stapo_cpu = True
    dist.state_dict = state_dict


SHIMS = (_proxy_torch, _cpu_rng_state, _cuda_type_names, _thd_attention, _no_fused_softmax, _fresh_torch_adam_state)


def install() -> None:
    """Apply every megatron-core shim in this process (idempotent)."""
    for shim in SHIMS:
        shim()
