"""The pre-passes of ``run_prepare_batch`` leave the update as they found it: every module's ``training`` flag (so
activation checkpointing and dropout stay on for the update after a pre-pass that runs an eval-mode forward), and the
random state; they run in the order given, the metrics merged in that order.

Source: ``stapo_verl.core.losses.run_prepare_batch`` (copied into verl's ``verl/workers/utils/losses.py`` by the
upstream series); Hugging Face's ``GradientCheckpointingLayer.__call__`` checkpoints only when ``self.training``.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from stapo_verl.core.losses import run_prepare_batch
from support.tiny_qwen3 import tiny_qwen3


def _engine(module):
    return SimpleNamespace(module=module, get_data_parallel_group=lambda: None)


def _checkpointed_layers(model, ids) -> int:
    """How many decoder layers a training forward of ``model`` on ``ids`` runs through activation checkpointing."""
    calls = []
    for layer in model.model.layers:
        inner = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, _inner=inner, **k: calls.append(1) or _inner(*a, **k)
    model(input_ids=ids).logits.sum().backward()
    return len(calls)


def test_an_eval_forward_in_a_pre_pass_leaves_activation_checkpointing_on_for_the_update():
    model = tiny_qwen3()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.arange(1, 9)[None]
    flags = [m.training for m in model.modules()]
    assert _checkpointed_layers(model, ids) == 2  # both layers, without a pre-pass

    def current_policy_forward(data, *, engine, dp_group):  # as an engine's eval mode + no-grad forward does
        engine.module.eval()
        with torch.no_grad():
            engine.module(input_ids=ids)
        return {"actor/forward": 1.0}

    assert run_prepare_batch((None, current_policy_forward), {}, _engine(model)) == {"actor/forward": 1.0}
    assert [m.training for m in model.modules()] == flags and all(flags)
    assert _checkpointed_layers(model, ids) == 2  # the update still checkpoints every layer


def test_a_module_kept_in_eval_mode_stays_there_and_megatron_chunks_are_restored():
    chunks = [torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)) for _ in range(2)]
    chunks[1][1].eval()  # its owner keeps this dropout off
    before = [[m.training for m in c.modules()] for c in chunks]

    def flip(data, *, engine, dp_group):
        for chunk in engine.module:
            chunk.train(not chunk.training)
        return {}

    run_prepare_batch([flip], {}, _engine(chunks))  # Megatron's engine.module is a list of model chunks
    assert [[m.training for m in c.modules()] for c in chunks] == before == [[True, True, True], [True, True, False]]


def test_pre_passes_run_in_order_on_the_update_rng_and_metrics_merge_in_order():
    order = []

    def first(data, *, engine, dp_group):
        order.append(("first", torch.rand(()).item()))
        return {"a": 1.0, "shared": 1.0}

    def second(data, *, engine, dp_group):
        order.append(("second", torch.rand(()).item()))
        return {"b": 2.0, "shared": 2.0}

    torch.manual_seed(3)
    draws = torch.rand(2).tolist()
    torch.manual_seed(3)
    metrics = run_prepare_batch((first, None, second), {}, _engine(None))
    assert order == [("first", draws[0]), ("second", draws[1])]  # in order, drawing from the update's state
    assert metrics == {"a": 1.0, "b": 2.0, "shared": 2.0}
    order.clear()  # any iterable of pre-passes, a generator included: each runs once, in order
    assert run_prepare_batch((fn for fn in (first, None, second)), {}, _engine(None)) == metrics
    assert [name for name, _ in order] == ["first", "second"]
    assert run_prepare_batch((None, None), {}, _engine(None)) == {}
