"""verl's vLLM rollout (``rollout.name=vllm``) on the CPU platform: the two parts of verl's vLLM path that vLLM's CPU
build cannot run, replaced (and nothing else): the packed linear kernels, which a weight sync does not reach
(:func:`patch_cpu_unquantized_gemm`), and vLLM's batch-invariant mode, which needs Triton
(:func:`patch_vllm_http_server_init`).

verl syncs the actor's weights into the running vLLM engine by calling the model's ``load_weights`` with the new
tensors (``verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension._update_weights``), which copies them
into the model's parameters through each parameter's ``weight_loader``. On GPUs an unquantized linear layer computes
from that parameter, so the next rollout uses the new weights. vLLM's CPU build does not: after loading,
``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` packs every linear layer's weight into a oneDNN
(or sgl-kernel) handle and computes from that copy; for linear layers it also replaces the parameter by an empty one
without a ``weight_loader`` (``remove_weight=True``). The first weight sync then fails (``'Parameter' object has no
attribute 'weight_loader'``), and the tied LM head, whose weight is kept, would go on computing from the warm start.

:func:`patch_cpu_unquantized_gemm` makes every 2-D linear layer compute with ``torch.nn.functional.linear`` from its
parameter, which is the dispatcher's own fallback branch: a weight sync then reaches the next rollout. What it costs
is the packed kernels' speed (nothing measurable on the tiny model). Its upstream replacement is vLLM's layerwise
reload (``vllm.model_executor.model_loader.reload``: restore the kernel tensors, load, process again), used by verl
for a weight sync, or a vLLM CPU linear that keeps its parameter authoritative. Installed by
:func:`stapo_verl.cpu.register` with a post-import hook, so only in processes that import vLLM (the engine's worker);
its ledger entries (:data:`stapo_verl.cpu.ledger.VLLM_PATCHES`) are checked first.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

import torch

logger = logging.getLogger(__name__)


def patch_cpu_unquantized_gemm(_module: ModuleType) -> None:
    """Wrap ``module.dispatch_cpu_unquantized_gemm`` so that 2-D weights compute from their parameter (idempotent).

    Meta and non-2-D weights (MoE experts, convolutions) go to vLLM's own dispatcher unchanged; so do all weights when
    the layer has no parameter named ``weight``.

    Args:
        _module: ``vllm.model_executor.layers.utils`` (the post-import hook's argument; imported by name below).
            ``linear.py`` and ``vocab_parallel_embedding.py`` import the function from it at call time, so rebinding
            the module attribute reaches both.
    Raises:
        stapo_verl.cpu.ledger.IncompatibleSiteError: the installed vLLM differs from the one this was written for
            (:data:`stapo_verl.cpu.ledger.VLLM_PATCHES`), unless ``STAPO_ALLOW_UNSUPPORTED_VERL=1``.
    """
    import vllm.model_executor.layers.utils as layers_utils

    from stapo_verl.cpu import ledger

    orig = layers_utils.dispatch_cpu_unquantized_gemm
    if getattr(orig, "_stapo_cpu_patched", False):
        return
    ledger.check(ledger.VLLM_PATCHES, ledger.VLLM_WRITTEN_FOR)

    @functools.wraps(orig)
    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        weight = getattr(layer, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.is_meta or weight.ndim != 2:
            return orig(layer, remove_weight)
        # vLLM calls layer.cpu_linear(x, layer.weight, bias): the parameter as it is at call time
        layer.cpu_linear = torch.nn.functional.linear

    dispatch_cpu_unquantized_gemm._stapo_cpu_patched = True
    layers_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm


def patch_vllm_http_server_init(_module: ModuleType) -> None:
    """Wrap ``module.vLLMHttpServer.__init__`` so that vLLM's batch-invariant mode stays off on CPU (idempotent).

    With ``rollout.full_determinism=True`` verl's server sets ``VLLM_BATCH_INVARIANT=1`` for the engine it starts,
    next to per-request seeds (``sampling_params["seed"]``) and ``verl.workers.engine.utils.enable_full_determinism``.
    vLLM's batch-invariant kernels are Triton kernels, which vLLM's CPU build does not have (the first forward fails
    in ``batch_invariant.mean_dim``: ``'function' object is not subscriptable``). The wrapper sets the variable back
    to ``0`` after verl's ``__init__`` (the engine is spawned later, by ``launch_server``) and keeps the rest of
    verl's full determinism: the per-request seeds, which make what a request samples independent of the requests
    it is batched with, up to the last bits of the logits (docs/results.md measures how far two runs differ).

    Args:
        _module: ``verl.workers.rollout.vllm_rollout.vllm_async_server`` (the post-import hook's argument; imported
            by name below).
    """
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    orig = vLLMHttpServer.__init__
    if getattr(orig, "_stapo_cpu_patched", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if os.environ.get("VLLM_BATCH_INVARIANT") == "1":
            logger.info("CPU platform: VLLM_BATCH_INVARIANT=0 (vLLM's batch-invariant kernels need Triton on a GPU); "
                        "per-request seeds stay on")
            os.environ["VLLM_BATCH_INVARIANT"] = "0"

    __init__._stapo_cpu_patched = True
    vLLMHttpServer.__init__ = __init__
