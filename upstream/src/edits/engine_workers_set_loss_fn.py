    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_loss_fn(self, loss_fn, loss_mask_fn=None):
        """Set the loss function and, optionally, a loss-mask pre-pass.

        Args:
            loss_fn: ``loss_fn(model_output, data, dp_group)`` called by the engine on every micro-batch.
            loss_mask_fn: optional ``loss_mask_fn(data, dp_group) -> metrics`` run by ``train_batch`` on each
                optimizer mini-batch before the engine counts its tokens; it may rewrite ``loss_mask`` in place
                (e.g. ``partial(verl.workers.utils.losses.apply_policy_loss_mask, actor_config)``).
        """
        self.loss_fn = loss_fn
        self.loss_mask_fn = loss_mask_fn
