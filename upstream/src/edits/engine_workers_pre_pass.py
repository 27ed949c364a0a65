        # Loss-mask pre-pass: token selections that need statistics of the whole optimizer mini-batch rewrite
        # loss_mask here, before the engine counts batch_num_tokens from it (token-mean over the kept tokens).
        loss_mask_metrics = {}
        if self.loss_mask_fn is not None:
            loss_mask_metrics = self.loss_mask_fn(data, dp_group=self.engine.get_data_parallel_group())

