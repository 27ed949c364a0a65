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
"""The policy-token-mask pre-pass (``apply_policy_token_mask``) and ``ppo_loss`` with a mask.

With a mask K selected by ``policy_loss.token_mask``, the policy-gradient (PG) term of ``ppo_loss`` must equal the
registered policy loss evaluated with ``response_mask := K`` and ``batch_num_tokens := Σ K``, for every policy
loss and ``loss_agg_mode``; the KL and entropy terms must not change. Batches use the layout
``TrainingWorker.train_batch`` receives (nested response fields), with one prompt token per sequence.
"""

import math

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import get_policy_loss_fn, register_policy_token_mask
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.utils import losses
from verl.workers.utils.losses import apply_policy_token_mask, ppo_loss

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
LOSS_MODES = ("vanilla", "gspo", "cispo", "sapo", "geo_mean", "dppo_tv")
MASK = "even_positions"
BS, T = 6, 7


def keep_even_positions(batch, config, dp_group=None):
    """A toy mask: keep the tokens at even positions of each response."""
    keep = batch["response_mask"].bool() & (torch.arange(batch["response_mask"].shape[1]) % 2 == 0)
    return keep, {"actor/even_positions/kept": float(keep.sum())}


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """A private registry holding the toy mask."""
    monkeypatch.setattr(core_algos, "POLICY_TOKEN_MASK_REGISTRY", dict(core_algos.POLICY_TOKEN_MASK_REGISTRY))
    register_policy_token_mask(MASK, required_fields=("response_mask",))(keep_even_positions)
    return core_algos.POLICY_TOKEN_MASK_REGISTRY


def _actor_config(loss_mode="vanilla", loss_agg_mode="token-mean", token_mask=None, **kwargs):
    return ActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=BS,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode=loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, token_mask=token_mask),
        rollout_n=1,
        kl_loss_type="low_var_kl",
        **kwargs,
    )


def _nested(x, lens):
    return torch.nested.as_nested_tensor([x[i, :n] for i, n in enumerate(lens)], layout=torch.jagged)


def _mini_batch(seed=0):
    """(TensorDict as train_batch receives it, the same fields padded (BS, T), response mask (BS, T) bool)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, T + 1, (BS,), generator=g)
    lens[0] = T  # the padded width is the longest response
    rm = torch.arange(T) < lens[:, None]
    old = -torch.rand(BS, T, generator=g, dtype=torch.float64) * 2

    def randn():
        return torch.randn(BS, T, generator=g, dtype=torch.float64)

    padded = {
        "old_log_probs": old,
        "log_prob": old + 0.3 * randn(),
        "ref_log_prob": old + 0.1 * randn(),
        "advantages": torch.randn(BS, 1, generator=g, dtype=torch.float64).expand(BS, T),
        "entropy": torch.rand(BS, T, generator=g, dtype=torch.float64) * 3,
        "rollout_is_weights": torch.rand(BS, T, generator=g, dtype=torch.float64) + 0.5,
    }
    padded = {key: value * rm for key, value in padded.items()}
    lens = lens.tolist()
    fields = {
        "prompts": _nested(torch.ones(BS, 1, dtype=torch.int64), [1] * BS),
        "responses": _nested(torch.ones(BS, T, dtype=torch.int64), lens),
        "response_mask": _nested(rm.long(), lens),
        "loss_mask": _nested(rm.long(), lens),
    }
    fields.update({key: _nested(value, lens) for key, value in padded.items() if key != "log_prob"})
    return TensorDict(fields, batch_size=[BS]), padded, rm


def _model_output(td, log_prob, entropy=None):
    """``model_output`` as the engine hands it to the loss: per sequence [prompt token, response], shifted by one."""
    lens = td["responses"].offsets().diff().tolist()

    def nest(x):
        return torch.nested.as_nested_tensor(
            [torch.cat([x[i, :n], x.new_zeros(1)]) for i, n in enumerate(lens)], layout=torch.jagged
        )

    return {"log_probs": nest(log_prob), **({} if entropy is None else {"entropy": nest(entropy)})}


def _loss(config, td, padded, rows=None, entropy=False):
    """``ppo_loss`` on the micro-batch ``rows`` (default: all) of the mini-batch ``td``, as the engine calls it.

    Returns the loss, the gradient of the current log-probs (BS, T) and the aggregated metrics.
    """
    rows = list(range(BS)) if rows is None else rows
    log_prob = padded["log_prob"].clone().requires_grad_(True)
    micro_batch = tu.index_select_tensor_dict(td, rows)
    batch_num_tokens = int(td["loss_mask"].values().sum())  # the engine's count over the whole mini-batch
    tu.assign_non_tensor(micro_batch, dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=BS)
    model_output = _model_output(micro_batch, log_prob[rows], padded["entropy"][rows] if entropy else None)
    loss, metrics = ppo_loss(config, model_output, micro_batch)
    loss.backward()
    values = {key: float(value.aggregate()) if hasattr(value, "aggregate") else value for key, value in metrics.items()}
    return loss.detach(), log_prob.grad, values


def _kept(td):
    return td["policy_loss_mask"].to_padded_tensor(0).bool()


def test_pre_pass_writes_the_mask_and_its_count_and_leaves_the_engine_masks_alone():
    td, _, rm = _mini_batch()
    before = {key: td[key].to_padded_tensor(0).clone() for key in ("response_mask", "loss_mask")}
    metrics = apply_policy_token_mask(_actor_config(token_mask=MASK), td)
    expected = rm & (torch.arange(T) % 2 == 0)
    assert td["policy_loss_mask"].is_nested and td["policy_loss_mask"].dtype == torch.int64
    assert torch.equal(_kept(td), expected)
    assert tu.get(td, "policy_batch_num_tokens") == int(expected.sum()) > 0
    # the mask's metrics, and the PG term's denominator
    n_keep = float(expected.sum())
    assert metrics == {"actor/even_positions/kept": n_keep, "actor/policy_batch_num_tokens": n_keep}
    for key, value in before.items():  # the engine keeps counting batch_num_tokens from loss_mask
        assert torch.equal(td[key].to_padded_tensor(0), value)


def test_the_mask_sees_exactly_its_declared_fields_padded():
    seen = {}

    def spy(batch, config, dp_group=None):
        seen.update(batch=batch, dp_group=dp_group)
        return batch["response_mask"].bool(), {}

    register_policy_token_mask("spy", required_fields=("advantages", "response_mask", "global_steps"))(spy)
    td, padded, _ = _mini_batch()
    tu.assign_non_tensor(td, global_steps=12)
    apply_policy_token_mask(_actor_config(token_mask="spy"), td, dp_group="the dp group")
    assert sorted(seen["batch"]) == ["advantages", "global_steps", "response_mask"]
    assert torch.equal(seen["batch"]["advantages"], padded["advantages"])  # padded (BS, T), zeros after the end
    assert seen["batch"]["global_steps"] == 12 and seen["dp_group"] == "the dp group"


@pytest.mark.parametrize("loss_agg_mode", AGG_MODES)
@pytest.mark.parametrize("loss_mode", LOSS_MODES)
def test_the_mask_composes_with_policy_losses_and_aggregation_modes(loss_mode, loss_agg_mode):
    td, padded, rm = _mini_batch(seed=3)
    config = _actor_config(loss_mode, loss_agg_mode, token_mask=MASK)
    apply_policy_token_mask(config, td)
    keep = _kept(td)
    n_keep = int(keep.sum())
    assert 0 < n_keep < int(rm.sum())
    loss, grad, metrics = _loss(config, td, padded)
    # oracle: the registered policy loss itself with response_mask := K and batch_num_tokens := Σ K
    oracle_config = _actor_config(loss_mode, loss_agg_mode)
    oracle_config.global_batch_info.update(
        dp_size=1, batch_num_tokens=n_keep, global_batch_size=BS, loss_scale_factor=None
    )
    log_prob = padded["log_prob"].clone().requires_grad_(True)
    oracle, oracle_metrics = get_policy_loss_fn(loss_mode)(
        old_log_prob=padded["old_log_probs"],
        log_prob=log_prob,
        advantages=padded["advantages"],
        response_mask=keep,
        loss_agg_mode=loss_agg_mode,
        config=oracle_config,
        rollout_is_weights=padded["rollout_is_weights"],
    )
    oracle.backward()
    torch.testing.assert_close(loss, oracle.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, log_prob.grad, rtol=1e-12, atol=1e-12)
    assert torch.count_nonzero(grad[rm & ~keep]) == 0  # masked tokens get exactly zero gradient
    assert torch.count_nonzero(grad[keep]) > 0
    for key, value in oracle_metrics.items():  # e.g. pg_clipfrac, ppo_kl: over the kept tokens only
        assert metrics[key] == pytest.approx(float(value), rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_a_fully_silenced_response_still_counts_in_global_batch_size(loss_agg_mode):
    register_policy_token_mask("all_but_the_first_response", required_fields=("response_mask",))(
        lambda batch, config, dp_group=None: (batch["response_mask"].bool() & (torch.arange(BS) > 0)[:, None], {})
    )
    td, padded, _ = _mini_batch(seed=7)
    config = _actor_config(loss_agg_mode=loss_agg_mode, token_mask="all_but_the_first_response")
    apply_policy_token_mask(config, td)
    masked, _, _ = _loss(config, td, padded)
    # response 0 contributes 0 and the seq-mean still divides by global_batch_size = BS (verl's convention): the
    # loss of responses 1..BS-1 alone, as one micro-batch of the same mini-batch without a mask
    plain_td, _, _ = _mini_batch(seed=7)
    rest, _, _ = _loss(_actor_config(loss_agg_mode=loss_agg_mode), plain_td, padded, rows=list(range(1, BS)))
    assert masked.item() == pytest.approx(rest.item(), rel=1e-12) != 0


def test_the_kl_and_entropy_terms_are_unchanged_by_the_mask():
    kwargs = dict(use_kl_loss=True, kl_loss_coef=0.3, entropy_coeff=0.01)
    td, padded, _ = _mini_batch(seed=4)
    _, _, plain = _loss(_actor_config(**kwargs), td, padded, entropy=True)
    config = _actor_config(token_mask=MASK, **kwargs)
    apply_policy_token_mask(config, td)
    _, _, masked = _loss(config, td, padded, entropy=True)
    assert masked["kl_loss"] == plain["kl_loss"] != 0
    assert masked["actor/entropy_loss"] == plain["actor/entropy_loss"] != 0
    assert masked["actor/pg_loss"] != plain["actor/pg_loss"]


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_add_up_to_the_mini_batch(loss_agg_mode):
    td, padded, _ = _mini_batch(seed=5)
    config = _actor_config(loss_agg_mode=loss_agg_mode, token_mask=MASK)
    apply_policy_token_mask(config, td)
    whole_loss, whole_grad, _ = _loss(config, td, padded)
    parts = [_loss(config, td, padded, rows=rows) for rows in ([0, 1], [2, 3, 4], [5])]
    assert sum(loss.item() for loss, _, _ in parts) == pytest.approx(whole_loss.item(), rel=1e-12)
    torch.testing.assert_close(sum(grad for _, grad, _ in parts), whole_grad, rtol=1e-12, atol=1e-15)


def test_a_configured_mask_that_did_not_run_raises():
    td, padded, _ = _mini_batch(seed=6)
    with pytest.raises(KeyError, match="policy_batch_num_tokens"):  # the pre-pass's count, never a silent default
        _loss(_actor_config("cispo", token_mask=MASK), td, padded)


def test_a_missing_field_is_named():
    register_policy_token_mask("needs_entropy", required_fields=("entropy", "values"))(keep_even_positions)
    td, _, _ = _mini_batch()
    with pytest.raises(KeyError, match=r"missing \['values'\]"):
        apply_policy_token_mask(_actor_config(token_mask="needs_entropy"), td)


def test_nothing_kept_gives_a_finite_zero_loss_attached_to_the_graph():
    register_policy_token_mask("nothing", required_fields=("response_mask",))(
        lambda batch, config, dp_group=None: (torch.zeros_like(batch["response_mask"], dtype=torch.bool), {})
    )
    td, padded, _ = _mini_batch(seed=2)
    config = _actor_config(token_mask="nothing")
    apply_policy_token_mask(config, td)
    assert tu.get(td, "policy_batch_num_tokens") == 0
    loss, grad, metrics = _loss(config, td, padded)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0
    assert all(math.isfinite(float(value)) for value in metrics.values())


def test_the_kept_count_is_summed_over_the_data_parallel_group(monkeypatch):
    calls = []

    def all_reduce(tensor, op=None, group=None):  # another rank of the group keeps 5 tokens
        calls.append(group)
        tensor += 5

    fake = type("dist", (), {})()
    fake.is_initialized, fake.get_world_size = (lambda: True), (lambda group=None: 2)
    fake.all_reduce, fake.ReduceOp = all_reduce, torch.distributed.ReduceOp
    monkeypatch.setattr(losses, "dist", fake)
    monkeypatch.setattr(losses, "get_device_id", lambda: "cpu")  # the group's device, where the count is reduced
    td, _, rm = _mini_batch()
    metrics = apply_policy_token_mask(_actor_config(token_mask=MASK), td, dp_group="dp")
    local = int((rm & (torch.arange(T) % 2 == 0)).sum())
    assert tu.get(td, "policy_batch_num_tokens") == local + 5 and calls == ["dp"]
    assert metrics["actor/policy_batch_num_tokens"] == local + 5


def test_the_pg_term_reads_the_kept_count_and_the_other_terms_the_engines(monkeypatch):
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))

    seen = []

    @core_algos.register_policy_loss("records")
    def records(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        seen.append(config.global_batch_info["batch_num_tokens"])
        return (log_prob * response_mask).sum(), {}

    td, padded, rm = _mini_batch(seed=3)
    config = _actor_config("records", token_mask=MASK)
    apply_policy_token_mask(config, td)
    assert tu.get(td, "policy_batch_num_tokens") < int(rm.sum())  # the two denominators differ
    _loss(config, td, padded)
    assert seen == [tu.get(td, "policy_batch_num_tokens")]  # the PG term divides by the kept count ...
    # ... and the KL and entropy terms, and the next call, read the engine's count
    assert config.global_batch_info["batch_num_tokens"] == int(rm.sum())
