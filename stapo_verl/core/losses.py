"""The policy-token-mask pre-pass and ``ppo_loss`` with the mask on the policy-gradient term: what the series adds to
``verl/workers/utils/losses.py`` (copied by ``upstream/build_series.py``; CI fails when they drift). The KL and
entropy terms keep ``response_mask`` and ``batch_num_tokens``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils import tensordict_utils as tu
from verl.utils.device import get_device_id
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import no_padding_2_padding, response_to_nested

from stapo_verl.core import registry as core_algos  # verl: from verl.trainer.ppo import core_algos

#: the mini-batch fields the pre-pass writes
POLICY_LOSS_MASK_KEY = "policy_loss_mask"
POLICY_BATCH_NUM_TOKENS_KEY = "policy_batch_num_tokens"


def run_prepare_batch(prepare_batch_fns, data: TensorDict, engine) -> dict[str, float]:
    """Run ``fn(data, *, engine, dp_group) -> metrics`` in order (None skipped); restore every module's ``training``."""
    fns = [fn for fn in prepare_batch_fns if fn is not None]
    if not fns:
        return {}
    roots = getattr(engine, "module", None)
    roots = roots if isinstance(roots, list | tuple) else [roots]  # Megatron: a list of model chunks
    flags = [(m, m.training) for root in roots if isinstance(root, torch.nn.Module) for m in root.modules()]
    metrics: dict[str, float] = {}
    try:
        for fn in fns:
            metrics.update(fn(data, engine=engine, dp_group=engine.get_data_parallel_group()))
    finally:
        for module, training in flags:
            module.training = training
    return metrics


def apply_policy_token_mask(config: ActorConfig, data: TensorDict, dp_group=None, engine=None) -> dict[str, float]:
    """Write ``policy_loss_mask`` and ``policy_batch_num_tokens`` (its sum over ``dp_group``) of ``token_mask`` for
    ``ppo_loss``; return the mask's metrics. ``engine``: unused (the pre-pass contract passes it). Raises ValueError
    (unregistered mask), KeyError (a field the mask reads is missing)."""
    mask_fn, fields = core_algos.get_policy_token_mask(config.policy_loss.token_mask)
    missing = [key for key in fields if key not in data.keys()]
    if missing:
        raise KeyError(f"policy_loss.token_mask={config.policy_loss.token_mask!r}: the mini-batch is missing {missing}")
    distributed = dp_group is not None and dist.is_initialized() and dist.get_world_size(dp_group) > 1
    device = get_device_id() if distributed else None
    batch = {key: tu.get(data, key) for key in fields}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            batch[key] = (value.to_padded_tensor(0) if value.is_nested else value).to(device=device)
    keep, metrics = mask_fn(batch, config, dp_group)
    response_mask = data["response_mask"]
    padded_mask = response_mask.to_padded_tensor(0) if response_mask.is_nested else response_mask
    keep = (keep.to(padded_mask.device).bool() & padded_mask.bool()).to(response_mask.dtype)
    num_tokens = keep.sum(dtype=torch.int64).to(device=device)
    if distributed:
        dist.all_reduce(num_tokens, group=dp_group)
    data["policy_loss_mask"] = response_to_nested(keep, response_mask) if response_mask.is_nested else keep
    tu.assign_non_tensor(data, policy_batch_num_tokens=(count := num_tokens.item()))  # as verl's batch_num_tokens
    return {**metrics, "actor/policy_batch_num_tokens": float(count)}


def ppo_loss(config: ActorConfig, model_output, data: TensorDict, dp_group=None):
    """Computes ppo loss from model output (log_prob, entropy, values, etc. ) and old_log_probs from data."""
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    # global batch info for loss aggregation
    batch_num_tokens = data["batch_num_tokens"]
    config.global_batch_info["dp_size"] = data["dp_size"]
    config.global_batch_info["batch_num_tokens"] = batch_num_tokens
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    token_mask = config.policy_loss.get("token_mask", None)  # the PG term divides by the kept tokens, KL/entropy by all
    pg_batch_num_tokens = max(data["policy_batch_num_tokens"], 1) if token_mask is not None else batch_num_tokens
    # assumes that if any of the global batch info is set, the policy_loss_fn will
    # normalize using dp_size/global_bsz/global_token; in this case, metric aggregation should be SUM
    # to reflect the mean loss over the global batch
    if (
        data["dp_size"] > 1
        or data["batch_num_tokens"] is not None
        or data["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    ):
        metric_aggregation = AggregationType.SUM
    else:
        metric_aggregation = AggregationType.MEAN

    metrics = {}

    # select fields and convert to padded tensor
    fields = ["response_mask", "old_log_probs", "advantages"]
    if "rollout_is_weights" in data:
        fields.append("rollout_is_weights")
    if "ref_log_prob" in data:
        fields.append("ref_log_prob")
    if token_mask is not None:
        fields.append("policy_loss_mask")
    data = data.select(*fields).to_padded_tensor()

    response_mask = data["response_mask"].to(bool)
    # compute policy loss
    old_log_prob = data["old_log_probs"]
    advantages = data["advantages"]
    rollout_is_weights = data.get("rollout_is_weights", None)

    loss_agg_mode = config.loss_agg_mode

    loss_mode = config.policy_loss.get("loss_mode", "vanilla")

    policy_loss_fn = get_policy_loss_fn(loss_mode)
    pg_mask, pg_log_prob = response_mask, log_prob
    if token_mask is not None:  # only the kept tokens; zeros elsewhere, since NaN * 0 would reach the loss
        pg_mask = response_mask & data["policy_loss_mask"].bool()
        old_log_prob, pg_log_prob, advantages, rollout_is_weights = (
            None if x is None else torch.where(pg_mask, x, 0.0)
            for x in (old_log_prob, log_prob, advantages, rollout_is_weights)
        )
    config.global_batch_info["batch_num_tokens"] = pg_batch_num_tokens  # the losses read their denominator here
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=pg_log_prob,
        advantages=advantages,
        response_mask=pg_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
    config.global_batch_info["batch_num_tokens"] = batch_num_tokens  # Σ loss_mask again for the terms below

    # AggregationType.MEAN for pg metrics: assumes policy_loss_fn normalizes by local_bsz/local_tokens
    # Ex: in compute_policy_loss_vanilla, pg_metrics are pg_clipfrac, ppo_kl, pg_clipfrac_lower
    pg_metrics = Metric.from_dict(pg_metrics, aggregation=AggregationType.MEAN)

    metrics.update(pg_metrics)
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)
    policy_loss = pg_loss

    # add entropy loss
    if entropy is not None:
        entropy_loss = agg_loss(
            loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
        )
        entropy_coeff = config.entropy_coeff
        policy_loss -= entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=metric_aggregation)

    # add kl loss
    if config.use_kl_loss:
        ref_log_prob = data["ref_log_prob"]
        # compute kl loss
        kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(
            loss_mat=kld, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )

        policy_loss += kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=metric_aggregation)
        metrics["kl_coef"] = config.kl_loss_coef

    return policy_loss, metrics
