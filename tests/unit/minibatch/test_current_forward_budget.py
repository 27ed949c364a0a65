"""The ``stats_source=current_minibatch`` forward runs at the token budget the memory plan assumes (the training one).

verl 0.9.1's ``ActorRolloutRefWorker`` copies ``actor.ppo_max_token_len_per_gpu`` into the actor engine config's
``max_token_len_per_gpu`` and ``rollout.log_prob_max_token_len_per_gpu`` into its ``infer_max_token_len_per_gpu``
(``verl.workers.engine_workers``); the worker below holds the two values of the 8B recipe that way. The forward's
keys are read where the engine receives them (``engine.infer_batch``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from stapo_verl.integration.verl_0_9_1.training_worker import current_forward_keys
from stapo_verl.launch.memory_plan import current_forward_tokens
from stapo_verl.minibatch.current_policy import current_policy_statistics


class _Reached(Exception):
    pass


class _RecordingEngine:
    """An engine whose ``infer_batch`` records the token budget it was handed, then stops the call."""

    def __init__(self):
        self.budget = None

    def eval_mode(self, **kwargs):
        import contextlib

        return contextlib.nullcontext()

    def infer_batch(self, td, loss_function=None):
        from verl.utils import tensordict_utils as tu

        self.budget = tu.get(td, "max_token_len_per_gpu")
        raise _Reached


def test_the_forward_gets_the_training_budget_the_plan_assumes():
    config = OmegaConf.create({"actor_rollout_ref": {
        "actor": {"ppo_max_token_len_per_gpu": 32768, "policy_loss": {"stats_source": "current_minibatch"}},
        "rollout": {"log_prob_max_token_len_per_gpu": 65536}}})
    arr = config.actor_rollout_ref
    engine_config = SimpleNamespace(use_dynamic_bsz=True, use_fused_kernels=False,
                                    max_token_len_per_gpu=arr.actor.ppo_max_token_len_per_gpu,
                                    micro_batch_size_per_gpu=None,
                                    infer_max_token_len_per_gpu=arr.rollout.log_prob_max_token_len_per_gpu,
                                    infer_micro_batch_size_per_gpu=None)
    engine = _RecordingEngine()
    worker = SimpleNamespace(engine=engine, engine_config=engine_config, model_config={"use_remove_padding": True})
    data = TensorDict({"old_log_probs": torch.zeros(2, 3)}, batch_size=[2])
    with pytest.raises(_Reached):
        current_policy_statistics(engine, data, current_forward_keys(worker))
    assert engine.budget == current_forward_tokens(config) == 32768
    config.actor_rollout_ref.actor.policy_loss.stats_source = "old_policy"
    assert current_forward_tokens(config) is None  # no such phase in the plan
