"""The worker methods the upstream series changes in ``verl.workers.engine_workers`` (one source: copied into verl's
classes by ``upstream/build_series.py``; the plugin installs them behind the dispatchers of its ``worker`` module).
Per optimizer mini-batch, inside the engine's train mode and before the engine counts and splits it, the
caller's ``prepare_batch_fn`` runs, then the actor's ``policy_token_mask_fn`` (set by ``init_model``), whose count the
loss divides by.
"""

from __future__ import annotations

from codetiming import Timer
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from stapo_verl.core.losses import run_prepare_batch


class TrainingWorker:
    """The methods the series changes in ``verl.workers.engine_workers.TrainingWorker`` (its ``__init__`` also sets
    ``self.prepare_batch_fn = None`` and ``self.policy_token_mask_fn = None``)."""

    def set_loss_fn(self, loss_fn, prepare_batch_fn=None):
        """Set the loss and ``prepare_batch_fn(data, *, engine, dp_group) -> metrics``, run before the token mask."""
        self.loss_fn = loss_fn
        self.prepare_batch_fn = prepare_batch_fn

    def train_batch(self, data: TensorDict) -> TensorDict:
        assert self.loss_fn is not None, "loss function can't be None when calling train_batch"
        assert not self.engine_config.forward_only, "Can't run `train_batch` when forward_only is in the engine config."
        # global_token_num should be a list of number of tokens of each seq in this batch
        global_token_num = tu.get(data, key="global_token_num")
        disable_auto_offload = tu.get(data, key="disable_auto_offload", default=False)
        images_seqlens = tu.get(data, key="images_seqlens", default=None)

        # inject engineering parameters if not specified
        default_keys = dict(
            use_remove_padding=self.model_config.get("use_remove_padding", False),
            use_dynamic_bsz=self.engine_config.use_dynamic_bsz,
            max_token_len_per_gpu=self.engine_config.max_token_len_per_gpu,
            micro_batch_size_per_gpu=self.engine_config.micro_batch_size_per_gpu,
            use_fused_kernels=self.engine_config.use_fused_kernels,
        )

        for key, val in default_keys.items():
            if key not in data.keys():
                tu.assign_non_tensor(data, **{key: val})

        with (
            self.engine.train_mode(disable_auto_offload=disable_auto_offload),
            Timer(name="train_batch", logger=None) as timer,
        ):
            prepare_metrics = run_prepare_batch((self.prepare_batch_fn, self.policy_token_mask_fn), data, self.engine)
            output = self.engine.train_batch(data, loss_function=self.loss_fn)
            # containing loss, model_output and metrics
            # for training, we only care about loss and metrics
        delta_time = timer.last

        update_lr_scheduler = tu.get(data, key="update_lr_scheduler", default=False)
        # update lr scheduler
        if update_lr_scheduler:
            lr = self.engine.lr_scheduler_step()
        else:
            lr = None

        if self.engine.is_mp_src_rank_with_outputs():
            # we don't need model_output in training. Maybe we change out mind later
            output.pop("model_output")
            if lr is not None:
                output["metrics"]["lr"] = lr
            final_output = self._postprocess_output(
                output,
                global_token_num=global_token_num,
                delta_time=delta_time,
                forward_only=False,
                images_seqlens=images_seqlens,
            ).cpu()
            tu.assign_non_tensor(final_output, metrics={**tu.get(final_output, "metrics"), **prepare_metrics})  # global
        else:
            final_output = None

        return final_output


class ActorRolloutRefWorker:
    """The method the series changes in ``verl.workers.engine_workers.ActorRolloutRefWorker``."""

    def set_loss_fn(self, loss_fn, prepare_batch_fn=None):
        self.actor.set_loss_fn(loss_fn=loss_fn, prepare_batch_fn=prepare_batch_fn)
