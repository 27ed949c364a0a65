"""The upstream series' hand-written wiring and validation against the plugin's, on the installed verl 0.9.1's files.

``build_series.py --check-tree`` (``scripts/check_upstream.sh``) checks the definitions the series copies from the
plugin; what the series writes by hand are verl's worker wiring and config checks. Here PR A's and PR B's hunks of
``verl/workers/engine_workers.py`` and ``verl/workers/config/actor.py`` (``upstream/src/a.diff``, ``b.diff``) are
applied with ``git apply --recount`` to copies of the installed verl's own files and loaded as modules of their own
(no network, no sdist), then run beside the plugin:

* the worker: the mini-batch the engine receives (the mask and its count, before the engine counts its tokens),
  what verl's ``_postprocess_output`` reduces over DP, and the metrics the worker returns, for the series'
  ``TrainingWorker.train_batch`` with ``prepare_batch_fn`` and for the plugin's wrapped one;
* the config: which ``tau_p`` / ``entropy_quantile`` values each refuses, with and without a token mask.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

import stapo_verl.plugin  # noqa: F401  (the plugin's config class checks that the plugin is loaded)
from stapo_verl.core import losses as core_losses
from stapo_verl.core import registry
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError, StapoPolicyLossConfig
from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch
from support.series import series_file
from support.verl_batches import actor_config

def patched_verl_module(path: str, tmp: Path, monkeypatch):
    """The installed verl's ``path`` with the series applied (:func:`support.series.series_file`), loaded as
    ``<its package>._series_<name>`` (so its relative imports are the installed package's) for the test's duration."""
    target = series_file(path, tmp)
    name = ".".join([*Path(path).parent.parts, f"_series_{Path(path).stem}"])
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def series(tmp_path, monkeypatch):
    """The series' ``engine_workers`` and ``config.actor`` modules; the names they import from the series' other
    files (``apply_policy_token_mask``, ``run_prepare_batch``, ``get_policy_token_mask``) are the plugin's, which the
    series copies."""
    import verl.trainer.ppo.core_algos as core_algos
    import verl.workers.utils.losses as verl_losses

    monkeypatch.setattr(verl_losses, "apply_policy_token_mask", core_losses.apply_policy_token_mask, raising=False)
    monkeypatch.setattr(verl_losses, "run_prepare_batch", core_losses.run_prepare_batch, raising=False)
    monkeypatch.setattr(core_algos, "get_policy_token_mask", registry.get_policy_token_mask, raising=False)
    return SimpleNamespace(
        engine_workers=patched_verl_module("verl/workers/engine_workers.py", tmp_path / "w", monkeypatch),
        actor=patched_verl_module("verl/workers/config/actor.py", tmp_path / "c", monkeypatch))


def _mini_batch() -> TensorDict:
    """Three responses (lengths 4, 2, 3) with entropies, in verl's nested response layout."""
    lengths, ent = (4, 2, 3), torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.7, 0.2, 0, 0], [0.05, 0.8, 0.6, 0]])
    mask = torch.nested.as_nested_tensor([torch.ones(n, dtype=torch.int64) for n in lengths], layout=torch.jagged)
    entropy = torch.nested.as_nested_tensor([ent[i, :n] for i, n in enumerate(lengths)], layout=torch.jagged)
    td = TensorDict({"response_mask": mask, "loss_mask": mask.clone(), "entropy": entropy}, batch_size=[3])
    tu.assign_non_tensor(td, global_steps=4, update_lr_scheduler=True)
    return td


def _worker(config, record):
    def train_mode(**kwargs):
        record["mode"] = "train"
        return nullcontext()

    def engine_train_batch(data, loss_function=None):
        record["engine"] = {k: tu.get(data, k) for k in ("policy_loss_mask", "policy_batch_num_tokens")}
        return {"model_output": {}, "loss": [0.0], "metrics": {"actor/pg_loss": [0.5]}}

    def postprocess_output(output, **kwargs):  # verl's reduction over DP, as the metrics it is given
        record["reduced"] = dict(output["metrics"])
        return tu.get_tensordict({}, non_tensor_dict={"metrics": dict(output["metrics"])})

    engine = SimpleNamespace(train_mode=train_mode, train_batch=engine_train_batch,
                             is_mp_src_rank_with_outputs=lambda: True, get_data_parallel_group=lambda: None,
                             get_data_parallel_rank=lambda: 0, lr_scheduler_step=lambda: None)
    engine_config = SimpleNamespace(forward_only=False, use_dynamic_bsz=False, max_token_len_per_gpu=128,
                                    micro_batch_size_per_gpu=1, use_fused_kernels=False)
    return SimpleNamespace(engine=engine, engine_config=engine_config, model_config={}, profiler=None,
                           loss_fn=functools.partial(core_losses.ppo_loss, config=config), prepare_batch_fn=None,
                           policy_token_mask_fn=None,
                           _postprocess_output=postprocess_output)


def test_the_series_worker_wiring_does_what_the_plugins_wrapper_does(series):
    import verl.workers.engine_workers as engine_workers

    config = actor_config("vanilla", "top_entropy", top_entropy_ratio=0.5)
    assert getattr(engine_workers.TrainingWorker.train_batch, "__wrapped__", None) is not None  # the plugin's
    series_run, plugin_run = {}, {}
    worker = _worker(config, series_run)
    worker.policy_token_mask_fn = functools.partial(core_losses.apply_policy_token_mask, config)  # as init_model does
    series_run["returned"] = tu.get(series.engine_workers.TrainingWorker.train_batch(worker, _mini_batch()), "metrics")
    worker = _worker(config, plugin_run)
    worker.policy_token_mask_fn = StapoPrepareBatch(config, {})  # as the plugin's init_model hook does
    plugin_run["returned"] = tu.get(engine_workers.TrainingWorker.train_batch(worker, _mini_batch()), "metrics")
    # the engine receives the mask and its count, before it counts its own tokens: ⌈0.5 · 9⌉ = 5 kept tokens
    assert series_run["engine"]["policy_batch_num_tokens"] == plugin_run["engine"]["policy_batch_num_tokens"] == 5
    mask_s, mask_p = (r["engine"]["policy_loss_mask"].to_padded_tensor(0) for r in (series_run, plugin_run))
    assert torch.equal(mask_s, mask_p) and mask_s.tolist() == [[1, 0, 1, 0], [1, 0, 0, 0], [0, 1, 1, 0]]
    # verl reduces the engine's metrics over DP; the mask's (global already) join the output after it, in both
    assert series_run["reduced"] == plugin_run["reduced"] == {"actor/pg_loss": [0.5]}
    assert series_run["returned"] == plugin_run["returned"]
    assert series_run["returned"]["actor/policy_batch_num_tokens"] == 5.0


class RecordingPrepareBatch(StapoPrepareBatch):
    """The plugin's pre-pass, recording the engine and DP group it was given and a draw from the RNG it ran under."""

    def __init__(self, config, seen: list):
        super().__init__(config, {})
        self.seen = seen

    def __call__(self, data, *, engine, dp_group=None):
        self.seen.append((engine, dp_group, torch.rand(()).item()))
        return super().__call__(data, engine=engine, dp_group=dp_group)


@pytest.mark.parametrize("through", ["series", "plugin"])
def test_the_pre_pass_gets_the_engine_and_the_update_rng(series, through):
    import verl.workers.engine_workers as engine_workers

    config = actor_config("vanilla", "s2t")
    module = series.engine_workers if through == "series" else engine_workers
    seen, record = [], {}
    worker = _worker(config, record)
    worker.prepare_batch_fn = RecordingPrepareBatch(config, seen)  # the same pre-pass through both paths
    if through == "series":  # the series' pre-pass is verl's generic hook: hand it the mask as a partial
        worker.prepare_batch_fn = functools.partial(RecordingPrepareBatch.__call__, worker.prepare_batch_fn)
    torch.manual_seed(5)
    expected_next = torch.rand(()).item()
    torch.manual_seed(5)
    td = _mini_batch()
    td["old_log_probs"], td["advantages"] = td["entropy"].clone(), td["entropy"].clone()
    module.TrainingWorker.train_batch(worker, td)
    assert [(engine, group) for engine, group, _ in seen] == [(worker.engine, None)]  # the engine, its DP group
    assert seen[0][2] == expected_next  # the pre-pass draws from the update's RNG state, no reseed
    assert record["engine"]["policy_batch_num_tokens"] == tu.get(td, "policy_batch_num_tokens")  # before the count


class SpyPrepareBatch:
    """A caller's pre-pass (a user's, another plugin's): records whether the mask ran before it, writes a field."""

    def __init__(self):
        self.calls = []

    def __call__(self, data, *, engine, dp_group=None):
        self.calls.append("policy_loss_mask" in data.keys())
        data["spy_field"] = data["response_mask"].clone()
        return {"actor/spy/calls": float(len(self.calls))}


def _s2t_mini_batch() -> TensorDict:
    td = _mini_batch()
    td["old_log_probs"] = td["entropy"].clone() - 9.0  # p ≈ e^-9 < τ_p: every token a candidate
    td["advantages"] = td["entropy"].clone() + 1.0
    return td


@pytest.mark.parametrize("through", ["TrainingWorker", "ActorRolloutRefWorker"])
@pytest.mark.parametrize("path", ["series", "plugin"])
def test_a_callers_pre_pass_runs_before_the_mask_and_both_count(series, path, through):
    """A spy pre-pass set through either ``set_loss_fn`` runs, first, and S2T's mask still runs after it: the same
    mask, count and metrics through the series and through the plugin."""
    import verl.workers.engine_workers as engine_workers

    module = series.engine_workers if path == "series" else engine_workers
    config = actor_config("vanilla", "s2t")
    results = {}
    for with_spy in (False, True):
        record, spy = {}, SpyPrepareBatch()
        worker = _worker(config, record)
        worker.policy_token_mask_fn = (functools.partial(core_losses.apply_policy_token_mask, config)
                                       if path == "series" else StapoPrepareBatch(config, {}))
        loss = functools.partial(core_losses.ppo_loss, config=config)
        if with_spy and through == "TrainingWorker":
            module.TrainingWorker.set_loss_fn(worker, loss, prepare_batch_fn=spy)
        elif with_spy:
            worker.set_loss_fn = functools.partial(module.TrainingWorker.set_loss_fn, worker)
            module.ActorRolloutRefWorker.set_loss_fn(SimpleNamespace(actor=worker), loss, prepare_batch_fn=spy)
        td = _s2t_mini_batch()
        metrics = tu.get(module.TrainingWorker.train_batch(worker, td), "metrics")
        results[with_spy] = (record["engine"]["policy_loss_mask"].to_padded_tensor(0), metrics)
        if with_spy:
            assert spy.calls == [False]  # once, before the mask
            assert "spy_field" in td.keys() and metrics["actor/spy/calls"] == 1.0
            assert isinstance(worker.policy_token_mask_fn, functools.partial | StapoPrepareBatch)  # the mask stayed
    (mask_alone, alone), (mask_with, with_spy_metrics) = results[False], results[True]
    assert torch.equal(mask_alone, mask_with)  # the spy changed nothing the mask reads
    assert {k: v for k, v in with_spy_metrics.items() if k != "actor/spy/calls"} == alone
    assert alone["actor/policy_batch_num_tokens"] == float(mask_alone.sum()) < 9  # the mask silenced tokens


def test_the_plugin_and_the_series_give_the_same_mask_count_and_metrics_with_a_callers_pre_pass(series):
    import verl.workers.engine_workers as engine_workers

    config = actor_config("vanilla", "s2t")
    out = {}
    for path, module in (("series", series.engine_workers), ("plugin", engine_workers)):
        record = {}
        worker = _worker(config, record)
        worker.policy_token_mask_fn = (functools.partial(core_losses.apply_policy_token_mask, config)
                                       if path == "series" else StapoPrepareBatch(config, {}))
        module.TrainingWorker.set_loss_fn(worker, worker.loss_fn, prepare_batch_fn=SpyPrepareBatch())
        metrics = tu.get(module.TrainingWorker.train_batch(worker, _s2t_mini_batch()), "metrics")
        out[path] = (record["engine"]["policy_loss_mask"].to_padded_tensor(0),
                     record["engine"]["policy_batch_num_tokens"], metrics)
    assert torch.equal(out["series"][0], out["plugin"][0]) and out["series"][1] == out["plugin"][1]
    # the plugin adds its diagnostics (actor/stapo/... statistics) on top of the series' metrics, never other values
    assert all(out["plugin"][2][k] == v for k, v in out["series"][2].items())


@pytest.mark.parametrize("token_mask", [None, "s2t", "top_entropy"])
def test_the_series_config_refuses_what_the_plugins_refuses(series, token_mask):
    grid = [(tau_p, q) for tau_p in (-0.1, 0.0, 1e-13, 0.002, 0.5, 1.0, 1.5)
            for q in (0.0, 1e-6, 0.75, 1.0, 1.5)]

    def refused(build, error, tau_p, q) -> bool:
        try:
            build(token_mask=token_mask, s2t_tau_p=tau_p, s2t_entropy_quantile=q)
        except error:
            return True
        return False

    series_refuses = {p for p in grid if refused(series.actor.PolicyLossConfig, ValueError, *p)}
    plugin_refuses = {p for p in grid if refused(functools.partial(StapoPolicyLossConfig, loss_mode="vanilla"),
                                                  StapoConfigError, *p)}
    assert series_refuses == plugin_refuses
    # only the S2T mask reads the keys; with it, everything outside 0 < tau_p < 1, 0 < q <= 1 is refused
    assert series_refuses == (set() if token_mask != "s2t"
                              else {(t, q) for t, q in grid if not (0 < t < 1 and 0 < q <= 1)})
