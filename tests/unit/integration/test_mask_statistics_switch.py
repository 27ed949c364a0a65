"""``policy_loss.mask_statistics``: on (the default), the plugin's ``train_batch`` wrapper computes the mask statistics
from the mask's keep (``mask_statistics``, its own exchange) and they join the metrics; off, no statistics code runs at all (nor the padding it needs)
and the mask's own metrics are unchanged. In one process, through the wrapper with a stand-in for verl's body."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
from support.verl_batches import actor_config, random_minibatch
from support.workers import as_training_worker
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

import stapo_verl.plugin  # noqa: F401  (the config class checks that the plugin is loaded)
from stapo_verl.core import losses as core_losses
from stapo_verl.diagnostics import stats
from stapo_verl.integration.verl_0_9_1 import training_worker
from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch
from stapo_verl.integration.verl_0_9_1.worker import wrap_train_batch

#: every entry point of the statistics' work: the low-probability pass, the per-rank partials, the exchange and
#: combination, and the worker's padding and call for them
STATISTICS_CODE = ((stats, "_low_probability"), (stats, "local_partials"), (training_worker, "mask_statistics"),
                   (training_worker, "minibatch_statistics"), (training_worker, "_padded_fields"))


def _verl_body(self, data):
    out = TensorDict({}, batch_size=[])
    tu.assign_non_tensor(out, metrics={})
    return out


def _train_batch(monkeypatch, loss_mode="stapo", **policy_loss) -> tuple[dict, list[str]]:
    """One mini-batch through the wrapper; returns its metrics and the statistics functions that ran."""
    ran = []
    for owner, name in STATISTICS_CODE:
        real = getattr(owner, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            ran.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    cfg = actor_config(loss_mode, **policy_loss)
    engine = SimpleNamespace(get_data_parallel_group=lambda: None, is_mp_src_rank_with_outputs=lambda: True,
                             get_data_parallel_rank=lambda: 0)
    worker = SimpleNamespace(loss_fn=functools.partial(core_losses.ppo_loss, config=cfg), engine=engine,
                             prepare_batch_fn=StapoPrepareBatch(cfg, {}),
                             model_config=SimpleNamespace(hf_config=SimpleNamespace(vocab_size=1000)))
    as_training_worker(worker, body=lambda worker, data: None)
    td = random_minibatch(bs=6, T=9, seed=4)["td"]
    tu.assign_non_tensor(td, global_steps=3, update_lr_scheduler=True)
    metrics = tu.get(wrap_train_batch(_verl_body)(worker, td), "metrics")
    monkeypatch.undo()
    return metrics, ran


def test_with_mask_statistics_off_no_statistics_code_runs(monkeypatch):
    on, ran_on = _train_batch(monkeypatch, mask_statistics=True)
    assert set(ran_on) == {"_low_probability", "local_partials", "mask_statistics", "minibatch_statistics",
                           "_padded_fields"}
    assert "actor/stapo/silenced_grad_share_upper" in on and "actor/stapo/candidate_entropy_p75" in on
    off, ran_off = _train_batch(monkeypatch, mask_statistics=False)
    assert ran_off == []
    # the mask's own metrics only, and the same ones
    assert not any(key.startswith(("actor/stapo/candidate_entropy", "actor/stapo/silenced_")) for key in off)
    assert off == {k: v for k, v in on.items() if k in off} and off["actor/stapo/num_masked"] > 0


def test_no_statistics_are_computed_for_a_mask_without_candidates(monkeypatch):
    # top_entropy has no S2T candidates: no statistics whatever the switch says
    metrics, ran = _train_batch(monkeypatch, "vanilla", token_mask="top_entropy", mask_statistics=True)
    assert ran == [] and "actor/top_entropy/kept_frac" in metrics


@pytest.mark.parametrize("value", ["yes", 1])
def test_the_switch_is_a_bool(value):
    from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError

    with pytest.raises(StapoConfigError, match=r"policy_loss\.mask_statistics="):
        actor_config("stapo", mask_statistics=value)
