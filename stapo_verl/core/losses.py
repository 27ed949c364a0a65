"""The policy-token-mask pre-pass and ``ppo_loss`` with the mask on the policy-gradient term.

These are the functions the upstream series adds to / changes in ``verl/workers/utils/losses.py`` (copied there
verbatim by ``upstream/build_series.py``; CI fails when the two drift). On verl 0.9.1 the plugin binds this
``ppo_loss`` where ``verl.workers.engine_workers`` builds the actor's loss function, and calls
:func:`apply_policy_token_mask` from ``TrainingWorker.train_batch`` (see ``stapo_verl.integration.verl_0_9_1``).

Data contract (one optimizer mini-batch, per rank):

================================  =====================================================================
``policy_loss_mask``              response-layout tensor (nested like ``response_mask``), 1 = the token
                                  enters the policy-gradient (PG) term; written by the pre-pass
``policy_batch_num_tokens``       non-tensor int: Σ ``policy_loss_mask`` over the mini-batch and the DP
                                  group; the PG term's token-mean denominator (verl's
                                  ``batch_num_tokens`` stays Σ ``loss_mask`` for the KL/entropy terms)
================================  =====================================================================

Only the PG term uses them: the policy loss sees ``response_mask := response_mask ∧ policy_loss_mask`` and
``global_batch_info["batch_num_tokens"] := policy_batch_num_tokens`` for the duration of its call, which composes
with every registered policy loss and every ``loss_agg_mode``. The KL and entropy terms keep ``response_mask`` and
``batch_num_tokens``, exactly as without a mask.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import no_padding_2_padding, response_to_nested

from stapo_verl.core.registry import get_policy_token_mask

POLICY_LOSS_MASK_KEY = "policy_loss_mask"
POLICY_BATCH_NUM_TOKENS_KEY = "policy_batch_num_tokens"


def apply_policy_token_mask(config: ActorConfig, data: TensorDict, dp_group=None) -> dict:
    """Run the configured policy token mask on one optimizer mini-batch, before the engine's micro-batch loop.

    Writes ``data["policy_loss_mask"]`` (layout and dtype of ``data["response_mask"]``) and the non-tensor
    ``policy_batch_num_tokens`` (Σ of the mask over this mini-batch and ``dp_group``). ``response_mask`` and
    ``loss_mask`` are not modified.

    Args:
        config: the actor config; ``config.policy_loss.token_mask`` names a registered mask (see
            :mod:`stapo_verl.core.registry`).
        data: this rank's share of the mini-batch, in the layout ``TrainingWorker.train_batch`` receives
            (nested or padded response fields, non-tensor entries).
        dp_group: the data-parallel group whose ranks together hold the mini-batch (``None``: one process).

    Returns:
        The mask's metrics (``{"actor/...": float}``) plus ``actor/policy_batch_num_tokens`` (the PG term's
        denominator), identical on every rank of ``dp_group``.

    Raises:
        ValueError: ``policy_loss.token_mask`` is not set or not registered.
        KeyError: the mini-batch lacks a field the mask declared (the message names them).
    """
    token_mask = get_policy_token_mask(config.policy_loss.get("token_mask", None))
    missing = [key for key in token_mask.required_fields if key not in data.keys()]
    if missing:
        raise KeyError(
            f"policy_loss.token_mask={token_mask.name!r} needs the mini-batch fields "
            f"{list(token_mask.required_fields)}; missing {missing}"
        )
    batch = {}
    for key in token_mask.required_fields:
        value = tu.get(data, key)
        batch[key] = value.to_padded_tensor(0) if isinstance(value, torch.Tensor) and value.is_nested else value
    keep, metrics = token_mask.fn(batch=batch, config=config, dp_group=dp_group)
    response_mask = data["response_mask"]
    valid = response_mask.to_padded_tensor(0) if response_mask.is_nested else response_mask
    keep = keep.bool() & valid.bool()
    num_tokens = keep.sum().to(torch.int64)
    if dp_group is not None and dist.is_initialized() and dist.get_world_size(dp_group) > 1:
        dist.all_reduce(num_tokens, op=dist.ReduceOp.SUM, group=dp_group)
    keep = keep.to(response_mask.dtype)
    data[POLICY_LOSS_MASK_KEY] = response_to_nested(keep, response_mask) if response_mask.is_nested else keep
    tu.assign_non_tensor(data, **{POLICY_BATCH_NUM_TOKENS_KEY: int(num_tokens.item())})
    return {**metrics, f"actor/{POLICY_BATCH_NUM_TOKENS_KEY}": float(num_tokens.item())}


def get_policy_batch_num_tokens(config: ActorConfig, data: TensorDict) -> int | None:
    """The PG term's token-mean denominator of this micro-batch, or ``None`` when no token mask is configured.

    Args:
        config: the actor config. data: one micro-batch as the engine passes it to the loss.

    Returns:
        ``data["policy_batch_num_tokens"]`` when ``policy_loss.token_mask`` is set, else ``None``.

    Raises:
        RuntimeError: a token mask is configured but the micro-batch carries no ``policy_loss_mask`` (the
            pre-pass did not run on its mini-batch), or the reverse. Training never proceeds silently without
            the configured mask.
    """
    token_mask = config.policy_loss.get("token_mask", None)
    present = POLICY_LOSS_MASK_KEY in data.keys()
    if token_mask is None and not present:
        return None
    if token_mask is None:
        raise RuntimeError(
            f"the micro-batch carries {POLICY_LOSS_MASK_KEY!r} but actor.policy_loss.token_mask is not set"
        )
    if not present or POLICY_BATCH_NUM_TOKENS_KEY not in data.keys():
        raise RuntimeError(
            f"actor.policy_loss.token_mask={token_mask!r} is set, but this micro-batch carries no "
            f"{POLICY_LOSS_MASK_KEY!r}/{POLICY_BATCH_NUM_TOKENS_KEY!r}: apply_policy_token_mask did not run on "
            "its optimizer mini-batch, so the mask would silently not apply. Refusing to compute the loss."
        )
    return int(tu.get(data, POLICY_BATCH_NUM_TOKENS_KEY))


def compute_masked_policy_loss(
    policy_loss_fn,
    *,
    policy_loss_mask: torch.Tensor,
    policy_batch_num_tokens: int,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: ActorConfig,
    rollout_is_weights: torch.Tensor | None = None,
):
    """Call a registered policy loss on the tokens of ``policy_loss_mask`` only.

    The loss sees ``response_mask := response_mask ∧ policy_loss_mask`` and, for the duration of the call,
    ``config.global_batch_info["batch_num_tokens"] := policy_batch_num_tokens`` (at least 1, so a mini-batch
    with nothing kept gives a finite zero loss still attached to the graph). Inputs at masked positions are
    replaced by zeros (``torch.where``), so a non-finite value outside the mask cannot reach the loss or its
    gradient (NaN · 0 is NaN).

    Args:
        policy_loss_fn: a function from ``POLICY_LOSS_REGISTRY`` (verl's ``PolicyLossFn`` signature).
        policy_loss_mask: (bs, T) bool. policy_batch_num_tokens: Σ of the mask over the mini-batch and DP.
        old_log_prob, log_prob, advantages: (bs, T) float. response_mask: (bs, T) bool.
        loss_agg_mode: verl aggregation mode. config: the actor config (its ``global_batch_info`` is restored).
        rollout_is_weights: (bs, T) float or None.

    Returns:
        What ``policy_loss_fn`` returns: ``(pg_loss 0-dim tensor, metrics)``.
    """
    keep = policy_loss_mask.bool() & response_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    batch_num_tokens = config.global_batch_info.get("batch_num_tokens")
    config.global_batch_info["batch_num_tokens"] = max(int(policy_batch_num_tokens), 1)
    try:
        return policy_loss_fn(
            old_log_prob=torch.where(keep, old_log_prob, zero),
            log_prob=torch.where(keep, log_prob, zero),
            advantages=torch.where(keep, advantages, zero),
            response_mask=keep,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=None if rollout_is_weights is None else torch.where(keep, rollout_is_weights, zero),
        )
    finally:
        config.global_batch_info["batch_num_tokens"] = batch_num_tokens


def ppo_loss(config: ActorConfig, model_output, data: TensorDict, dp_group=None):
    """Computes ppo loss from model output (log_prob, entropy, values, etc. ) and old_log_probs from data."""
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    # global batch info for loss aggregation
    config.global_batch_info["dp_size"] = data["dp_size"]
    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    # the policy token mask's denominator (None without a mask): only the policy-gradient term uses it
    policy_batch_num_tokens = get_policy_batch_num_tokens(config, data)

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
    if policy_batch_num_tokens is not None:
        fields.append(POLICY_LOSS_MASK_KEY)
    data = data.select(*fields).to_padded_tensor()

    response_mask = data["response_mask"].to(bool)
    # compute policy loss
    old_log_prob = data["old_log_probs"]
    advantages = data["advantages"]
    rollout_is_weights = data.get("rollout_is_weights", None)

    loss_agg_mode = config.loss_agg_mode

    loss_mode = config.policy_loss.get("loss_mode", "vanilla")

    policy_loss_fn = get_policy_loss_fn(loss_mode)
    if policy_batch_num_tokens is not None:
        policy_loss_fn = partial(
            compute_masked_policy_loss,
            policy_loss_fn,
            policy_loss_mask=data[POLICY_LOSS_MASK_KEY],
            policy_batch_num_tokens=policy_batch_num_tokens,
        )
    pg_loss, pg_metrics = policy_loss_fn(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )

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
