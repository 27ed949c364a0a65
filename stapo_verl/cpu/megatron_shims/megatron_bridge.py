"""Megatron-Bridge 0.5.1 (verl's default ``megatron.vanilla_mbridge=False`` weight path) on the CPU over gloo.

verl (``verl.workers.engine.megatron.transformer_impl.MegatronEngine._build_tf_config`` and ``_build_megatron_module``)
runs ``AutoBridge.from_hf_pretrained`` → ``to_megatron_provider`` → ``apply_overrides_and_finalize`` →
``provide_distributed_model`` (``verl.utils.megatron_utils.make_megatron_module``) → ``load_hf_weights``, and
``export_hf_weights`` for every weight sync. Sites (megatron/bridge/models/…):

* ``gpt_provider.py`` ``default_layer_spec`` (the provider's default ``transformer_layer_spec``) returns
  ``transformer_engine_layer_spec(config)``: Transformer Engine does not exist on the CPU. :func:`_local_layer_spec`
  rebinds that module-level name to the module's own ``local_layer_spec`` (megatron-core's local spec). Megatron-
  Bridge's mapping registry already names the local spec's separate norms (``MegatronMappingRegistry.
  _SEPARATE_LAYERNORM_REWRITES``), so the HF load and export need nothing else.
* ``model_provider.py`` ``get_model`` moves every chunk with ``model_module.cuda(torch.cuda.current_device())``:
  :func:`_stay_on_cpu` makes ``nn.Module.cuda`` a no-op for the duration of that one call, and the module's global
  ``torch`` is a :class:`~stapo_verl.cpu.megatron_shims.torch_proxy.TorchOnCPU` (as for megatron-core and mbridge).
* ``megatron/training/models/dist_utils.py`` ``_ddp_wrap`` (megatron-core 0.18's wheel; ``get_model`` calls it) builds
  the DDP wrappers on a side stream (``torch.cuda.Stream()``, ``torch.cuda.stream``): its global ``torch`` is a
  ``TorchOnCPU`` too, whose streams are torch's CPU no-op streams.
* ``conversion/param_mapping.py`` ``ReplicatedMapping.hf_to_megatron`` moves a replicated weight to
  ``torch.cuda.current_device()`` before broadcasting it over TP (TP > 1): the module's ``torch`` is a ``TorchOnCPU``.

Transformer Engine's names that Megatron-Bridge's import reads: :mod:`stapo_verl.cpu.megatron_shims.te_names`.
Ledger: :data:`stapo_verl.cpu.ledger.BRIDGE_PATCHES`.
"""

from __future__ import annotations

import functools

from stapo_verl.cpu.megatron_shims.bridge import without_cuda_moves
from stapo_verl.cpu.megatron_shims.torch_proxy import install_into


def _local_layer_spec() -> None:
    from megatron.bridge.models import gpt_provider

    if getattr(gpt_provider.transformer_engine_layer_spec, "_stapo_cpu", False):
        return

    @functools.wraps(gpt_provider.local_layer_spec)
    def local_layer_spec(config):
        return gpt_provider.local_layer_spec(config)

    local_layer_spec._stapo_cpu = True
    gpt_provider.transformer_engine_layer_spec = local_layer_spec


def _stay_on_cpu() -> None:
    from megatron.bridge.models import model_provider
    from megatron.bridge.models.conversion import param_mapping
    from megatron.training.models import dist_utils

    install_into(model_provider)
    install_into(dist_utils)
    install_into(param_mapping)
    model_provider.get_model = without_cuda_moves(model_provider.get_model)


def install() -> None:
    """Apply the Megatron-Bridge shims in this process (idempotent; imports Megatron-Bridge's model modules)."""
    _local_layer_spec()
    _stay_on_cpu()
