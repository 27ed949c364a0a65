"""The LM-head gradient norm, read at the engine's optimizer step (a collapse signal; DGG, arXiv 2605.19425).

verl 0.9.1's engines report only the total gradient norm (``BaseEngine.train_batch`` puts ``optimizer_step()``'s
return value into the metrics as ``grad_norm``). Where the plugin can read the LM-head's own gradient cheaply and
exactly, it reads it right after the engine's optimizer step (:func:`reading_lm_head_grad_norm` wraps the engine
instance's ``optimizer_step`` for the duration of one ``TrainingWorker.train_batch`` call): later the gradients are
gone, because ``TrainingWorker.train_batch`` leaves ``engine.train_mode()``, which zeroes them on exit.

* **FSDP / FSDP2** (``verl.workers.engine.fsdp``): ``engine.module.get_output_embeddings().weight.grad`` is the
  reduced gradient (a sharded ``DTensor`` under FSDP2; its norm is one all-reduce over the sharding mesh, one
  weight's worth of elementwise work). The engine's clipping (``clip_grad_norm_`` / verl's ``fsdp2_clip_grad_norm_``)
  scaled it in place by min(1, clip / (grad_norm + 1e-6)); dividing by that coefficient gives the pre-clip norm,
  the same quantity as verl's ``grad_norm``. With tied embeddings (``tie_word_embeddings``) the weight is shared
  with the input embedding and so is its gradient. FSDP1 without ``use_orig_params`` keeps flat parameters and has
  no per-weight gradient: None.
* **Megatron** (``verl.workers.engine.megatron``): read right *before* the optimizer step, from the DDP grad
  buffer (``main_grad``) of the output weight on the last pipeline stage (``GPTModel.output_layer.weight``, or with
  ``share_embeddings_and_output_weights`` the shared weight, whose gradient Megatron has already summed over the
  embedding and the output use), which ``finalize_model_grads`` has reduced over DP by then and which the optimizer
  has not clipped yet. The weight is split over TP by vocabulary, so the squared norm is summed over the TP group.
  Divided by the optimizer's loss scale (1 for bf16). Not available (None) with the distributed optimizer (verl's
  default) at DP > 1: the grad buffer is then reduce-scattered, each DP rank holding the reduced values of its own
  shard only, and the shard layout is internal to Megatron's optimizer.

Every rank of the engine runs the optimizer step, so every rank takes part in the FSDP2 norm's collective.
"""

from __future__ import annotations

import contextlib
import math

import torch


def _engine_kind(engine) -> str | None:
    module = type(engine).__module__
    if module.startswith("verl.workers.engine.fsdp"):
        return "fsdp"
    if module.startswith("verl.workers.engine.megatron"):
        return "megatron"
    return None


def _output_weight(engine):
    """FSDP: the HF model's output embedding weight (None without one)."""
    get = getattr(getattr(engine, "module", None), "get_output_embeddings", None)
    head = get() if callable(get) else None
    return getattr(head, "weight", None)


def megatron_output_weight(engine):
    """Megatron: the output (or shared embedding/output) weight of this rank's last-stage model chunk, or None
    (not the last pipeline stage, or a model without one)."""
    from verl.utils.megatron_utils import unwrap_model

    for chunk in reversed(list(getattr(engine, "module", None) or [])):
        model = unwrap_model(chunk)
        if not getattr(model, "post_process", False):
            continue
        if getattr(model, "share_embeddings_and_output_weights", False):
            return model.shared_embedding_or_output_weight()
        return getattr(getattr(model, "output_layer", None), "weight", None)
    return None


def megatron_lm_head_grad_norm(engine) -> float | None:
    """Megatron: the LM-head gradient norm before the optimizer step (see the module docstring), or None.

    Collective: every TP rank of the last pipeline stage must call it (ranks of other stages return None at once).
    """
    from megatron.core import parallel_state as mpu

    distributed = bool(getattr(getattr(engine, "engine_config", None), "use_distributed_optimizer", False))
    if distributed and mpu.get_data_parallel_world_size(with_context_parallel=True) > 1:
        return None
    weight = megatron_output_weight(engine)
    grad = getattr(weight, "main_grad", None) if weight is not None else None
    if grad is None:
        grad = getattr(weight, "grad", None) if weight is not None else None
    if grad is None:
        return None
    sq = grad.detach().float().pow(2).sum()
    if mpu.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(sq, group=mpu.get_tensor_model_parallel_group())
    scale = engine.optimizer.get_loss_scale() if hasattr(engine.optimizer, "get_loss_scale") else 1.0
    return float(sq.sqrt()) / float(scale)


def lm_head_grad_norm(engine, grad_norm) -> float | None:
    """FSDP: pre-clip L2 norm of the LM-head weight's gradient, right after the engine's optimizer step.

    Args:
        engine: the ``TrainingWorker``'s engine, between its ``optimizer_step`` and the next gradient zeroing.
        grad_norm: what ``optimizer_step`` returned (the total pre-clip gradient norm; float or 0-dim tensor).

    Returns:
        The norm (float); NaN when the step was skipped for a non-finite ``grad_norm`` (the engine zeroed the
        gradients); None for engines without a per-weight gradient (see the module docstring).
    """
    weight = _output_weight(engine) if _engine_kind(engine) == "fsdp" else None
    grad = getattr(weight, "grad", None) if weight is not None else None
    if grad is None:
        return None
    norm = torch.nn.utils.get_total_norm([grad.detach()], norm_type=2.0)
    if hasattr(norm, "full_tensor"):  # DTensor (FSDP2): one all-reduce over the sharding mesh
        norm = norm.full_tensor()
    norm = float(norm)
    total = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
    if not math.isfinite(total):
        return math.nan
    clip = getattr(getattr(engine, "optimizer_config", None), "clip_grad", None)
    if clip is not None:
        coef = float(clip) / (total + 1e-6)  # torch.nn.utils.clip_grad_norm_'s coefficient, clamped at 1
        if coef < 1.0:
            norm /= coef
    return norm


@contextlib.contextmanager
def reading_lm_head_grad_norm(engine, box: dict):
    """Within the block, each ``engine.optimizer_step()`` also stores the LM-head gradient norm in ``box["norm"]``
    (FSDP: :func:`lm_head_grad_norm` after the step; Megatron: :func:`megatron_lm_head_grad_norm` before it).

    The engine instance's bound ``optimizer_step`` is wrapped for the duration of the block and restored after it.
    Other engines are left untouched and ``box`` stays empty.
    """
    kind = _engine_kind(engine)
    if kind is None:
        yield box
        return
    step = engine.optimizer_step
    on_instance = "optimizer_step" in vars(engine)

    def optimizer_step():
        if kind == "megatron":
            box["norm"] = megatron_lm_head_grad_norm(engine)
            return step()
        grad_norm = step()
        box["norm"] = lm_head_grad_norm(engine, grad_norm)
        return grad_norm

    engine.optimizer_step = optimizer_step
    try:
        yield box
    finally:
        if on_instance:
            engine.optimizer_step = step
        else:
            del engine.optimizer_step
