

@register_policy_loss_mask("stapo")
def compute_stapo_loss_mask(
    batch: dict[str, torch.Tensor],
    config: ActorConfig,
    dp_group: Any = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """S2T keep mask of STAPO for one optimizer mini-batch (the ``stapo`` loss-mask pre-pass).

    STAPO: "Spurious-Token-Aware Policy Optimization", https://arxiv.org/abs/2602.15620, §3 and Algorithm 1.
    A response token is silenced iff its advantage is positive, its old-policy probability is below
    ``policy_loss.stapo_tau_p`` and its old-policy entropy is below τ_h, the ``policy_loss.stapo_entropy_quantile``
    quantile (linear interpolation) of the entropies of all candidates of the mini-batch on all data-parallel
    ranks. Tokens with a non-finite old log-prob or entropy are dropped as well.

    Args:
        batch: padded tensors of shape (batch_size, response_length) of this rank's share of the mini-batch:
            ``response_mask`` (bool/int), ``old_log_probs`` (float, log p), ``advantages`` (float) and
            ``entropy`` (float, nats; written by the trainer's old-log-prob pass).
        config: actor config; reads ``config.policy_loss.stapo_tau_p`` and ``stapo_entropy_quantile``.
        dp_group: data-parallel process group that holds the mini-batch, or None for a single process.

    Returns:
        tuple: keep mask (batch_size, response_length) bool, and metrics ``actor/stapo/*`` (global over the
        mini-batch: masked_frac, candidate_frac, num_masked, num_candidates, nonfinite_tokens, renorm_factor,
        and tau_h, masked_p_mean, masked_entropy_mean when defined).

    Raises:
        KeyError: a required field is missing, e.g. ``entropy`` with
            ``algorithm.rollout_correction.bypass_mode=True`` (no old-log-prob pass).
    """
    missing = [k for k in ("response_mask", "old_log_probs", "advantages", "entropy") if k not in batch]
    if missing:
        raise KeyError(
            f"loss_mode='stapo' needs the mini-batch fields {missing}: the old-policy log-probs and entropy come from "
            "the trainer's old-log-prob pass, which algorithm.rollout_correction.bypass_mode=True skips."
        )
    policy_loss = config.policy_loss
    keep, stats = s2t_keep_mask(
        batch["old_log_probs"],
        batch["entropy"],
        batch["advantages"],
        batch["response_mask"],
        tau_p=policy_loss.stapo_tau_p,
        q=policy_loss.stapo_entropy_quantile,
        group=dp_group,
    )
    return keep, stats.to_metrics()


@register_policy_loss("stapo")
def compute_policy_loss_stapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[ActorConfig] = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Compute the STAPO policy objective: the clipped PPO surrogate on the tokens kept by the S2T mask.

    STAPO: "Spurious-Token-Aware Policy Optimization", https://arxiv.org/abs/2602.15620, §3. The keep mask K
    was written into ``response_mask`` by the ``stapo`` loss-mask pre-pass (:func:`compute_stapo_loss_mask`,
    run by ``TrainingWorker.train_batch``), so the global ``batch_num_tokens`` in ``config.global_batch_info``
    is already Σ K over the mini-batch and ``token-mean`` renormalises over the kept tokens as in the paper.
    The surrogate, dual clip (``clip_ratio_c``), ``rollout_is_weights`` and every ``loss_agg_mode`` are those of
    :func:`compute_policy_loss_vanilla` (which aggregates with ``agg_loss(..., **config.global_batch_info)``).

    Args:
        old_log_prob (torch.Tensor):
            Log-probabilities of actions under the old policy, shape (batch_size, response_length).
        log_prob (torch.Tensor):
            Log-probabilities of actions under the current policy, shape (batch_size, response_length).
        advantages (torch.Tensor):
            Advantage estimates for each action, shape (batch_size, response_length).
        response_mask (torch.Tensor):
            The keep mask K, shape (batch_size, response_length).
        loss_agg_mode (str, optional):
            Aggregation mode for `agg_loss`. Defaults to "token-mean".
        config: `(verl.trainer.config.ActorConfig)`:
            config for the actor.
        rollout_is_weights: `(torch.Tensor)`:
            optional rollout-correction weights, shape (batch_size, response_length).

    Returns:
        tuple: the scalar loss and the metrics of :func:`compute_policy_loss_vanilla`.
    """
    keep = response_mask.bool()
    # Dropped tokens may hold non-finite values (a non-finite old log-prob): replace them instead of relying on
    # the mask, since agg_loss's seq-mean modes multiply by it and NaN * 0 is NaN (in the loss and its gradient).
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    if rollout_is_weights is not None:
        rollout_is_weights = torch.where(keep, rollout_is_weights, zero)
    return compute_policy_loss_vanilla(  # type: ignore[call-arg]
        old_log_prob=torch.where(keep, old_log_prob, zero),
        log_prob=torch.where(keep, log_prob, zero),
        advantages=torch.where(keep, advantages, zero),
        response_mask=keep,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
