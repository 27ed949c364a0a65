

PolicyLossMaskFn = Callable[
    [
        dict[str, torch.Tensor],  # padded (bs, response_length) fields of this rank's share of one mini-batch
        ActorConfig,  # config
        Any,  # dp_group: data-parallel process group that holds the mini-batch, or None
    ],
    tuple[torch.Tensor, dict[str, Any]],  # keep mask (bs, response_length) bool, metrics
]

POLICY_LOSS_MASK_REGISTRY: dict[str, PolicyLossMaskFn] = {}


def register_policy_loss_mask(name: str) -> Callable[[PolicyLossMaskFn], PolicyLossMaskFn]:
    """Register a loss-mask pre-pass for the policy loss registered under the same name.

    ``TrainingWorker.train_batch`` runs the pre-pass once per optimizer mini-batch, on this rank's share of it,
    *before* the engine counts ``batch_num_tokens`` from ``loss_mask``. It receives the padded
    (batch_size, response_length) tensors ``response_mask``, ``old_log_probs``, ``advantages`` and, when the
    trainer provides it, the old-policy ``entropy``; the bool keep mask it returns replaces ``response_mask`` and
    ``loss_mask``. ``token-mean`` aggregation is therefore normalised by the number of kept tokens of the whole
    mini-batch over all micro-batches and data-parallel ranks. Use it for token selections whose statistics span
    the whole mini-batch (e.g. STAPO's S2T mask), which a policy loss seeing one micro-batch cannot compute.

    Args:
        name (str): The loss_mode the pre-pass belongs to.

    Returns:
        function: Decorator function that registers the pre-pass.
    """

    def decorator(func: PolicyLossMaskFn) -> PolicyLossMaskFn:
        POLICY_LOSS_MASK_REGISTRY[name] = func
        return func

    return decorator


def get_policy_loss_mask_fn(name: str) -> Optional[PolicyLossMaskFn]:
    """Get the loss-mask pre-pass registered for a policy loss.

    Args:
        name: `(str)`
            The name of the policy loss (``policy_loss.loss_mode``).

    Returns:
        `(callable or None)`: The pre-pass, or None when the loss has none (the mini-batch is used as is).
    """
    return POLICY_LOSS_MASK_REGISTRY.get(name)
