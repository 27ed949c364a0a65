

def apply_policy_loss_mask(config: ActorConfig, data: TensorDict, dp_group=None) -> dict:
    """Run the loss-mask pre-pass of ``config.policy_loss.loss_mode`` on one optimizer mini-batch, in place.

    Called by ``TrainingWorker.train_batch`` before the engine computes ``batch_num_tokens`` from ``loss_mask``
    (see ``verl.trainer.ppo.core_algos.register_policy_loss_mask``). The pre-pass gets this rank's share as padded
    (batch_size, response_length) tensors; its bool keep mask is written back into ``response_mask`` and
    ``loss_mask`` in their own layout (nested or padded), so the engine's token count is the kept-token count.

    Args:
        config: actor config; ``config.policy_loss.loss_mode`` selects the pre-pass.
        data: the mini-batch TensorDict with ``response_mask``, ``old_log_probs``, ``advantages`` and optionally
            ``entropy`` (response layout) and ``loss_mask``.
        dp_group: data-parallel process group whose ranks together hold the mini-batch.

    Returns:
        dict: metrics of the pre-pass; ``{}`` (and ``data`` untouched) when the loss mode registers none.
    """
    mask_fn = get_policy_loss_mask_fn(config.policy_loss.get("loss_mode", "vanilla"))
    if mask_fn is None:
        return {}
    fields = [k for k in ("response_mask", "old_log_probs", "advantages", "entropy") if k in data.keys()]
    padded = data.select(*fields).to_padded_tensor()
    keep, metrics = mask_fn({k: padded[k] for k in fields}, config, dp_group)
    for key in ("response_mask", "loss_mask"):
        if key in data.keys():
            old = data[key]
            new = keep.to(old.dtype)
            data[key] = response_to_nested(new, old) if old.is_nested else new
    return metrics
