# Copyright 2026 Individual Contributor: stapo-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""The loss-mask pre-pass (register_policy_loss_mask): it rewrites loss_mask before the engine counts tokens.

The worker is driven with a mocked engine (as in test_engine_workers_mini_batch_trace_on_cpu.py), so no GPU or
ray is needed.
"""

from contextlib import nullcontext
from functools import partial
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo import core_algos
from verl.workers.config.actor import PolicyLossConfig
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.losses import apply_policy_loss_mask

MODE = "test_keep_first_token"


@pytest.fixture
def keep_first_token_mode():
    """Register a pre-pass that keeps the first response token of each sequence; unregister afterwards."""
    seen = {}

    @core_algos.register_policy_loss_mask(MODE)
    def keep_first(batch, config, dp_group=None):
        seen.update(fields=sorted(batch), dp_group=dp_group, shapes={k: tuple(v.shape) for k, v in batch.items()})
        keep = torch.zeros_like(batch["response_mask"], dtype=torch.bool)
        keep[:, 0] = True
        return keep & batch["response_mask"].bool(), {"actor/test/kept": float(keep.sum())}

    yield seen
    del core_algos.POLICY_LOSS_MASK_REGISTRY[MODE]


def _nested(rows, dtype):
    return torch.nested.as_nested_tensor([torch.tensor(r, dtype=dtype) for r in rows], layout=torch.jagged)


def _mini_batch():
    """Two responses of lengths 3 and 2 in verl's nested (jagged) response layout; loss_mask is response_mask."""
    response_mask = _nested([[1, 1, 1], [1, 1]], torch.int64)
    return TensorDict(
        {
            "response_mask": response_mask,
            "loss_mask": response_mask,
            "old_log_probs": _nested([[-1.0, -2.0, -3.0], [-4.0, -5.0]], torch.float32),
            "advantages": _nested([[1.0, 1.0, 1.0], [-1.0, -1.0]], torch.float32),
            "entropy": _nested([[0.1, 0.2, 0.3], [0.4, 0.5]], torch.float32),
        },
        batch_size=[2],
    )


def _config(loss_mode):
    return SimpleNamespace(policy_loss=PolicyLossConfig(loss_mode=loss_mode))


def test_registry_lookup():
    assert core_algos.get_policy_loss_mask_fn("vanilla") is None
    assert core_algos.get_policy_loss_mask_fn(MODE) is None


def test_apply_policy_loss_mask_rewrites_both_masks_in_their_layout(keep_first_token_mode):
    data = _mini_batch()
    metrics = apply_policy_loss_mask(_config(MODE), data, dp_group="dp")
    assert metrics == {"actor/test/kept": 2.0}
    for key in ("response_mask", "loss_mask"):
        assert data[key].is_nested and data[key].dtype == torch.int64
        assert [t.tolist() for t in data[key].unbind()] == [[1, 0, 0], [1, 0]]
    # the pre-pass sees padded (bs, T_max) tensors and the DP group
    assert keep_first_token_mode["fields"] == ["advantages", "entropy", "old_log_probs", "response_mask"]
    assert set(keep_first_token_mode["shapes"].values()) == {(2, 3)}
    assert keep_first_token_mode["dp_group"] == "dp"


def test_apply_policy_loss_mask_is_a_no_op_without_a_registered_pre_pass():
    data = _mini_batch()
    before = data["loss_mask"]
    assert apply_policy_loss_mask(_config("vanilla"), data) == {}
    assert data["loss_mask"] is before


def test_train_batch_runs_the_pre_pass_before_the_engine_counts_tokens(keep_first_token_mode):
    counted = []

    def engine_train_batch(data, loss_function=None):
        # what the FSDP/Megatron engines do first: batch_num_tokens = Σ loss_mask
        counted.append(int(data["loss_mask"].values().sum()))
        return {"model_output": {}, "loss": [0.0], "metrics": {"actor/pg_loss": [0.5]}}

    engine = SimpleNamespace(
        train_mode=lambda **kwargs: nullcontext(),
        train_batch=engine_train_batch,
        is_mp_src_rank_with_outputs=lambda: True,
        get_data_parallel_group=lambda: None,
    )
    worker = SimpleNamespace(
        engine=engine,
        engine_config=SimpleNamespace(
            forward_only=False,
            use_dynamic_bsz=False,
            max_token_len_per_gpu=128,
            micro_batch_size_per_gpu=1,
            use_fused_kernels=False,
        ),
        model_config={},
        loss_fn=lambda **kwargs: None,
        loss_mask_fn=partial(apply_policy_loss_mask, _config(MODE)),
        profiler=None,  # no DistProfiler: the decorated method runs as is
        _postprocess_output=MagicMock(),
    )
    TrainingWorker.train_batch(worker, _mini_batch())
    assert counted == [2]  # one kept token per response, not the 5 valid tokens
    metrics = worker._postprocess_output.call_args.args[0]["metrics"]
    assert metrics == {"actor/pg_loss": [0.5], "actor/test/kept": 2.0}

    # without a pre-pass the engine sees every valid token
    counted.clear()
    worker.loss_mask_fn = None
    TrainingWorker.train_batch(worker, _mini_batch())
    assert counted == [5]


def test_set_loss_fn_stores_the_pre_pass():
    worker = SimpleNamespace()
    TrainingWorker.set_loss_fn(worker, "loss", loss_mask_fn="pre_pass")
    assert (worker.loss_fn, worker.loss_mask_fn) == ("loss", "pre_pass")
    TrainingWorker.set_loss_fn(worker, "loss2")
    assert worker.loss_mask_fn is None
