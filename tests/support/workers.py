"""A stand-in ``TrainingWorker`` for the series' ``train_batch`` (:mod:`stapo_verl.core.engine_workers`), which the
plugin's ``train_batch`` wrapper runs for a worker with a pre-pass: what verl's worker has besides the engine."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

from verl.utils import tensordict_utils as tu


class ModelConfig(SimpleNamespace):
    """verl's ``HFModelConfig`` as far as ``train_batch`` reads it (``.get``) and the diagnostics (``hf_config``)."""

    def get(self, key, default=None):
        return getattr(self, key, default)


def as_training_worker(worker: SimpleNamespace, body=None) -> SimpleNamespace:
    """Give ``worker`` (with ``engine`` and ``loss_fn``) what the series' ``train_batch`` reads; returns it.

    ``body(worker, data)``, when given, stands in for the engine's forward/backward (``engine.train_batch``): it sees
    the mini-batch after the pre-passes, and the engine returns no metrics of its own. Without it, ``worker.engine``
    is a real engine and keeps its own ``train_mode``, ``train_batch`` and ``lr_scheduler_step``. verl's reduction of
    the metrics over DP (``_postprocess_output``) is the identity.
    """
    if body is not None:
        def engine_train_batch(data, loss_function=None):
            body(worker, data)
            return {"model_output": {}, "loss": [0.0], "metrics": {}}

        worker.engine.train_batch = engine_train_batch
        worker.engine.train_mode = lambda **kwargs: nullcontext()
        worker.engine.lr_scheduler_step = lambda: None
    worker.engine_config = SimpleNamespace(forward_only=False, use_dynamic_bsz=False, max_token_len_per_gpu=1 << 16,
                                           micro_batch_size_per_gpu=1, use_fused_kernels=False)
    worker.model_config = ModelConfig(**vars(getattr(worker, "model_config", SimpleNamespace())))
    worker._postprocess_output = lambda output, **kwargs: tu.get_tensordict(
        tensor_dict={}, non_tensor_dict={"metrics": dict(output["metrics"])})
    return worker
