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
"""``TrainingWorker`` runs its pre-passes once per mini-batch: the caller's (``set_loss_fn(loss_fn,
prepare_batch_fn=...)``), then the actor's ``policy_token_mask_fn``.

The worker methods are driven with mocked engines (as in test_engine_workers_mini_batch_trace_on_cpu.py), so no
GPU or ray is needed.
"""

from contextlib import nullcontext
from functools import partial
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import register_policy_token_mask
from verl.utils import tensordict_utils as tu
from verl.workers.config import PolicyLossConfig
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker
from verl.workers.utils.losses import apply_policy_token_mask


def keep_first_token(batch, config, dp_group=None):
    """A toy mask: keep the first response token of each sequence."""
    keep = torch.zeros_like(batch["response_mask"], dtype=torch.bool)
    keep[:, 0] = True
    return keep & batch["response_mask"].bool(), {"actor/keep_first/kept": float(keep.sum())}


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    monkeypatch.setattr(core_algos, "POLICY_TOKEN_MASK_REGISTRY", dict(core_algos.POLICY_TOKEN_MASK_REGISTRY))
    register_policy_token_mask("keep_first", required_fields=("response_mask",))(keep_first_token)


def _mini_batch():
    """Two responses of lengths 3 and 2 in the nested response layout; loss_mask is response_mask."""
    rows = [torch.ones(3, dtype=torch.int64), torch.ones(2, dtype=torch.int64)]
    mask = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    return TensorDict({"response_mask": mask, "loss_mask": mask.clone()}, batch_size=[2])


def _worker(seen):
    def engine_train_batch(data, loss_function=None):
        # what the engines do first: count the mini-batch's tokens, then split it into micro-batches
        seen.append({key: tu.get(data, key) for key in ("loss_mask", "policy_loss_mask", "policy_batch_num_tokens")})
        return {"model_output": {}, "loss": [0.0], "metrics": {"actor/pg_loss": [0.5]}}

    engine = SimpleNamespace(
        train_mode=lambda **kwargs: nullcontext(),
        train_batch=engine_train_batch,
        is_mp_src_rank_with_outputs=lambda: True,
        get_data_parallel_group=lambda: "dp",
    )
    return SimpleNamespace(
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
        prepare_batch_fn=None,
        policy_token_mask_fn=None,
        profiler=None,  # no DistProfiler: the decorated method runs as is
        # stands in for verl's reduction over the DP group: returns the metrics it is given, as its output does
        _postprocess_output=MagicMock(
            side_effect=lambda output, **kwargs: tu.get_tensordict({}, non_tensor_dict={"metrics": output["metrics"]})
        ),
    )


def test_set_loss_fn_stores_the_prepare_batch_fn():
    worker = SimpleNamespace()
    TrainingWorker.set_loss_fn(worker, "loss", prepare_batch_fn="pre_pass")
    assert (worker.loss_fn, worker.prepare_batch_fn) == ("loss", "pre_pass")
    TrainingWorker.set_loss_fn(worker, "another loss")
    assert worker.prepare_batch_fn is None


def test_train_batch_runs_the_pre_pass_before_the_engine_and_reports_its_metrics():
    seen = []
    worker = _worker(seen)
    worker.policy_token_mask_fn = partial(
        apply_policy_token_mask, SimpleNamespace(policy_loss=PolicyLossConfig(token_mask="keep_first"))
    )
    output = TrainingWorker.train_batch(worker, _mini_batch())
    (engine_saw,) = seen
    assert [t.tolist() for t in engine_saw["policy_loss_mask"].unbind()] == [[1, 0, 0], [1, 0]]
    assert engine_saw["policy_batch_num_tokens"] == 2
    assert int(engine_saw["loss_mask"].values().sum()) == 5  # batch_num_tokens is still Σ loss_mask
    # the mask's metrics are global over DP already: they join the output after verl's reduction
    assert worker._postprocess_output.call_args.args[0]["metrics"] == {"actor/pg_loss": [0.5]}
    metrics = tu.get(output, "metrics")
    assert metrics == {"actor/pg_loss": [0.5], "actor/keep_first/kept": 2.0, "actor/policy_batch_num_tokens": 2.0}


def test_train_batch_without_a_pre_pass_is_unchanged():
    seen = []
    worker = _worker(seen)
    output = TrainingWorker.train_batch(worker, _mini_batch())
    assert seen[0]["policy_loss_mask"] is None and seen[0]["policy_batch_num_tokens"] is None
    assert worker._postprocess_output.call_args.args[0]["metrics"] == {"actor/pg_loss": [0.5]}
    assert tu.get(output, "metrics") == {"actor/pg_loss": [0.5]}


def test_set_loss_fn_through_actor_rollout_ref_worker_keeps_the_mask():
    actor = SimpleNamespace(policy_token_mask_fn="mask")
    actor.set_loss_fn = partial(TrainingWorker.set_loss_fn, actor)
    ActorRolloutRefWorker.set_loss_fn(SimpleNamespace(actor=actor), "a recipe's loss", prepare_batch_fn="theirs")
    assert (actor.loss_fn, actor.prepare_batch_fn, actor.policy_token_mask_fn) == ("a recipe's loss", "theirs", "mask")
    ActorRolloutRefWorker.set_loss_fn(SimpleNamespace(actor=actor), "another loss")
    assert (actor.loss_fn, actor.prepare_batch_fn, actor.policy_token_mask_fn) == ("another loss", None, "mask")


def test_the_callers_pre_pass_runs_first_then_the_mask():
    seen, order = [], []
    worker = _worker(seen)
    mask = partial(apply_policy_token_mask, SimpleNamespace(policy_loss=PolicyLossConfig(token_mask="keep_first")))

    def theirs(data, *, engine, dp_group):
        order.append(("theirs", "policy_loss_mask" in data.keys()))
        data["their_field"] = data["response_mask"].clone()
        return {"actor/theirs": 1.0}

    def the_mask(data, *, engine, dp_group):
        order.append(("mask", "their_field" in data.keys()))
        return mask(data, engine=engine, dp_group=dp_group)

    worker.prepare_batch_fn, worker.policy_token_mask_fn = theirs, the_mask
    output = TrainingWorker.train_batch(worker, _mini_batch())
    assert order == [("theirs", False), ("mask", True)]  # the mask sees the batch as the caller's pre-pass left it
    assert seen[0]["policy_batch_num_tokens"] == 2
    assert tu.get(output, "metrics")["actor/theirs"] == 1.0 and tu.get(output, "metrics")["actor/keep_first/kept"] == 2


def test_a_pre_pass_that_switches_to_eval_leaves_the_training_flags_as_it_found_them():
    seen = []
    worker = _worker(seen)
    module = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Sequential(torch.nn.ReLU()))
    module[2].eval()  # a submodule its owner keeps in eval mode stays there
    before = [m.training for m in module.modules()]
    worker.engine.module = module
    flags_in_update = []
    engine_train_batch = worker.engine.train_batch

    def train_batch(data, loss_function=None):
        flags_in_update.append([m.training for m in module.modules()])
        return engine_train_batch(data, loss_function=loss_function)

    def forward_in_eval_mode(data, *, engine, dp_group):
        engine.module.eval()  # what an engine's eval mode does for a no-grad forward
        return {}

    worker.engine.train_batch, worker.prepare_batch_fn = train_batch, forward_in_eval_mode
    TrainingWorker.train_batch(worker, _mini_batch())
    assert flags_in_update == [before] and before == [True, True, True, False, False]


def test_the_pre_pass_gets_the_engine_in_train_mode_and_its_dp_group():
    seen, calls = [], []
    worker = _worker(seen)
    worker.engine.train_mode = lambda **kwargs: calls.append("train_mode") or nullcontext()

    def pre_pass(data, *, engine, dp_group):
        calls.append((engine, dp_group))
        return {}

    worker.prepare_batch_fn = pre_pass
    TrainingWorker.train_batch(worker, _mini_batch())
    assert calls == ["train_mode", (worker.engine, "dp")]  # in train mode, with the engine and DP group
