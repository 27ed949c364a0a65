"""``stats_source=current_minibatch``: the current policy's log-prob and entropy of one optimizer mini-batch.

The paper's Algorithm 1 takes p and H from the policy being updated. Before the micro-batch loop of every optimizer
mini-batch, one no-grad forward through the engine's own inference path gives them; the token mask then reads them
in place of the old-policy fields (same names, same layout), so the mask, its population (the whole mini-batch
across DP) and the exact renormalisation are unchanged. Cost: one forward per mini-batch.
"""

from __future__ import annotations

import math
import time

import torch

from stapo_verl.algo.config_ranges import ACTOR, KEY, StapoConfigError
from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY


class CurrentPolicyError(RuntimeError):
    """The engine returned no current-policy statistics on this rank."""


def check_current_minibatch_pipeline(pipeline_parallel_size: int) -> None:
    """``stats_source=current_minibatch`` needs Megatron pipeline parallelism 1: only the last pipeline stage holds
    the extra forward's outputs, and every rank needs them.

    Raises:
        StapoConfigError: ``pipeline_parallel_size`` > 1, naming both keys and the two ways out.
    """
    if pipeline_parallel_size > 1:
        raise StapoConfigError(
            f"{KEY}.stats_source=current_minibatch is not supported with {ACTOR}.megatron."
            f"pipeline_model_parallel_size={pipeline_parallel_size} (only the last pipeline stage holds the extra "
            "forward's outputs): use stats_source=old_policy or pipeline_model_parallel_size=1"
        )


def current_policy_statistics(engine, data, infer_keys: dict) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One no-grad forward of the mini-batch with the current weights.

    Uses ``engine.infer_batch`` under ``engine.eval_mode`` with ``calculate_entropy=True`` and the mini-batch's
    own ``temperature``, on a shallow copy of ``data`` (the training call keeps its keys).

    Args:
        engine: verl ``BaseEngine`` (FSDP or Megatron).
        data: the mini-batch TensorDict in the layout ``TrainingWorker.train_batch`` receives.
        infer_keys: the engine keys ``TrainingWorker.infer_batch`` injects (``micro_batch_size_per_gpu``,
            ``max_token_len_per_gpu``, ``use_dynamic_bsz``, ``use_remove_padding``, ``use_fused_kernels``); the
            worker passes the training budget (``training_worker.current_forward_keys``): this forward shares the
            GPU with the whole training state (the memory plan's current-policy phase).
            Without dynamic batch size the micro-batch size becomes ``gcd(len(data), micro_batch_size_per_gpu)``:
            verl requires it to divide the batch, and rows are independent in a no-grad forward.

    Returns:
        ``(log_prob, entropy, seconds)``: (bs, T) float32 each, in the layout of ``no_padding_2_padding`` (what
        ``ppo_loss`` uses), on the device of ``data["old_log_probs"]``; and the forward's wall time.

    Raises:
        stapo_verl.algo.config_ranges.StapoConfigError: Megatron with pipeline parallelism > 1 (the config's rule
            :func:`check_current_minibatch_pipeline`, checked again here on every rank
            before the forward, for callers that built no config).
        CurrentPolicyError: the engine returned no log-probs/entropy.

    Source: ``verl.workers.engine_workers.TrainingWorker.infer_batch``; ``verl.workers.engine.base.BaseEngine``.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    if "megatron" in type(engine).__module__:
        from megatron.core import parallel_state as mpu

        check_current_minibatch_pipeline(mpu.get_pipeline_model_parallel_world_size())
    td = data.copy()
    if POLICY_LOSS_MASK_KEY in td.keys():
        del td[POLICY_LOSS_MASK_KEY]
    keys = dict(infer_keys)
    if not keys.get("use_dynamic_bsz", True) and keys.get("micro_batch_size_per_gpu"):
        keys["micro_batch_size_per_gpu"] = math.gcd(len(data), int(keys["micro_batch_size_per_gpu"]))
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False, **keys)
    start = time.perf_counter()
    with engine.eval_mode(disable_auto_offload=True):
        out = engine.infer_batch(td, loss_function=None)
    seconds = time.perf_counter() - start
    model_output = (out or {}).get("model_output", {}) or {}
    if "log_probs" not in model_output or "entropy" not in model_output:
        raise CurrentPolicyError(
            "stats_source='current_minibatch': the engine's inference forward returned no log_probs/entropy on this "
            "rank; use stats_source=old_policy"
        )
    device = data["old_log_probs"].device
    log_prob = no_padding_2_padding(model_output["log_probs"], data).detach().float().to(device)
    entropy = no_padding_2_padding(model_output["entropy"], data).detach().float().to(device)
    return log_prob, entropy, seconds


def as_response_layout(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(bs, T) values in the layout and dtype of ``like`` (a nested or padded response-layout field).

    Source: ``verl.workers.utils.padding.response_to_nested``.
    """
    from verl.workers.utils.padding import response_to_nested

    if like.is_nested:
        return response_to_nested(values.to(like.dtype), like)
    return values.to(like.dtype)
