"""mbridge 0.15.1 (verl's ``megatron.vanilla_mbridge=True`` weight path) with megatron-core's local layer spec.

Sites (mbridge/core/…):

* ``llm_bridge.py:149-150`` ``_get_transformer_layer_spec`` calls ``get_gpt_decoder_block_spec(config,
  use_transformer_engine=True)``: Transformer Engine does not exist on the CPU. :func:`_local_layer_spec` rebinds
  the name in ``mbridge.core.llm_bridge`` to a wrapper that passes ``use_transformer_engine=False``
  (megatron-core's local spec: ``ColumnParallelLinear``/``RowParallelLinear``, ``DotProductAttention``, torch
  RMSNorm as separate ``input_layernorm``/``pre_mlp_layernorm`` modules).
* ``util.py:151`` ``get_model`` moves every chunk with ``model_module.cuda(torch.cuda.current_device())``:
  :func:`_stay_on_cpu` makes ``nn.Module.cuda`` a no-op for the duration of that one call (the name is rebound in
  ``mbridge.core.util`` and ``mbridge.core.bridge``, which imports it at :16).
* ``torch.cuda.current_device()`` in ``bridge.py:321`` (weight export) and ``util.py:323``: the modules' global
  ``torch`` is a :class:`stapo_verl.cpu.megatron_shims.torch_proxy.TorchOnCPU` (as for megatron-core).
* ``bridge.py:646/671`` ``_weight_name_mapping_mcore_to_hf``: knows only TE's fused norm names
  (``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``). :func:`_local_norm_names` maps the local
  spec's ``input_layernorm.weight``/``pre_mlp_layernorm.weight`` onto them first (both load and export use it).

Not covered: ``llm_bridge.py:76`` turns sequence parallelism on whenever TP > 1, which the local spec's torch norm
rejects (``megatron/core/transformer/torch_norm.py:32``); CPU runs pass
``override_transformer_config.sequence_parallel=False`` (a visible config key rather than a silent override).
"""

from __future__ import annotations

import contextlib
import functools

from stapo_verl.cpu.megatron_shims.torch_proxy import install_into

_LOCAL_TO_TE_NORM = (
    (".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
    (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),
)


def local_to_te_name(name: str) -> str:
    """``decoder.layers.3.input_layernorm.weight`` → ``decoder.layers.3.self_attention.linear_qkv.layer_norm_weight``
    (and the pre-MLP norm likewise); other names unchanged."""
    for local, te in _LOCAL_TO_TE_NORM:
        if name.endswith(local):
            return name[: -len(local)] + te
    return name


def _local_layer_spec() -> None:
    from mbridge.core import llm_bridge

    orig = llm_bridge.get_gpt_decoder_block_spec
    if getattr(orig, "_stapo_cpu", False):
        return

    @functools.wraps(orig)
    def get_gpt_decoder_block_spec(config, use_transformer_engine=True, **kwargs):
        return orig(config, use_transformer_engine=False, **kwargs)

    get_gpt_decoder_block_spec._stapo_cpu = True
    llm_bridge.get_gpt_decoder_block_spec = get_gpt_decoder_block_spec


def _local_norm_names() -> None:
    from mbridge.core.bridge import Bridge

    orig = Bridge._weight_name_mapping_mcore_to_hf
    if getattr(orig, "_stapo_cpu", False):
        return

    @functools.wraps(orig)
    def _weight_name_mapping_mcore_to_hf(self, mcore_weights_name: str) -> list[str]:
        return orig(self, local_to_te_name(mcore_weights_name))

    _weight_name_mapping_mcore_to_hf._stapo_cpu = True
    Bridge._weight_name_mapping_mcore_to_hf = _weight_name_mapping_mcore_to_hf


@contextlib.contextmanager
def _module_cuda_is_noop():
    from torch.nn.modules.module import Module  # torch.nn.Module

    prev = Module.cuda
    Module.cuda = lambda self, device=None: self
    try:
        yield
    finally:
        Module.cuda = prev


def without_cuda_moves(fn):
    """``fn`` wrapped so that ``nn.Module.cuda`` is a no-op while it runs (``fn`` itself if it already is); for the
    bridges' ``get_model``, which moves every model chunk to ``torch.cuda.current_device()``."""
    if getattr(fn, "_stapo_cpu", False):
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with _module_cuda_is_noop():
            return fn(*args, **kwargs)

    wrapped._stapo_cpu = True
    return wrapped


def _stay_on_cpu() -> None:
    from mbridge.core import bridge, util

    install_into(util)
    install_into(bridge)
    util.get_model = bridge.get_model = without_cuda_moves(util.get_model)


def install() -> None:
    """Apply the mbridge shims in this process (idempotent; imports mbridge)."""
    _stay_on_cpu()
    _local_layer_spec()
    _local_norm_names()
