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
"""CPU tests of loss_mode=stapo: its pre-pass (S2T keep mask) and the loss on the kept tokens.

Covers a closed-form loss, equality with ``vanilla`` when nothing is silenced (every loss_agg_mode, with and
without rollout_is_weights), micro-batch-split invariance, non-finite inputs and a missing entropy field.
"""

import math

import pytest
import torch
from tensordict import TensorDict

from verl.trainer.ppo.core_algos import (
    compute_policy_loss_stapo,
    compute_policy_loss_vanilla,
    compute_stapo_loss_mask,
    get_policy_loss_fn,
    get_policy_loss_mask_fn,
)
from verl.workers.config.actor import ActorConfig, PolicyLossConfig
from verl.workers.utils.losses import apply_policy_loss_mask

ALL_ROWS = slice(None)
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _config(tau_p=0.1, q=0.75, loss_agg_mode="token-mean") -> ActorConfig:
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        loss_agg_mode=loss_agg_mode,
        policy_loss=PolicyLossConfig(loss_mode="stapo", stapo_tau_p=tau_p, stapo_entropy_quantile=q),
    )


def _mini_batch(seed=0, bs=4, T=6):
    """Random mini-batch with ~half the tokens below τ_p = 0.1, mixed-sign advantages and ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    old_log_probs = torch.log(torch.rand(bs, T, generator=g) * 0.2)  # p in (0, 0.2)
    entropy = torch.rand(bs, T, generator=g) * 3.0
    advantages = torch.tensor([1.0, -0.5, 2.0, 0.7])[:bs, None].expand(bs, T).clone()
    lengths = torch.tensor([6, 4, 5, 3])[:bs]
    response_mask = torch.arange(T)[None, :] < lengths[:, None]
    log_prob = (old_log_probs + 0.1 * torch.randn(bs, T, generator=g)).requires_grad_()
    return dict(
        old_log_probs=old_log_probs,
        entropy=entropy,
        advantages=advantages,
        response_mask=response_mask,
        log_prob=log_prob,
    )


def _loss(fn, b, keep, config, mode, rows=ALL_ROWS, weights=None, **batch_info):
    config.global_batch_info.clear()
    config.global_batch_info.update(batch_info)
    return fn(
        old_log_prob=b["old_log_probs"][rows],
        log_prob=b["log_prob"][rows],
        advantages=b["advantages"][rows],
        response_mask=keep[rows],
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=None if weights is None else weights[rows],
    )


def test_stapo_is_registered_with_its_pre_pass():
    assert get_policy_loss_fn("stapo") is compute_policy_loss_stapo
    assert get_policy_loss_mask_fn("stapo") is compute_stapo_loss_mask


def test_closed_form_loss_on_the_kept_tokens():
    # one response, 4 tokens, Â = 1, ratio 1 (log_prob = old): candidates p = 0.05 with H = 0.1, 0.2, 0.3;
    # τ_h = Quantile_0.75(0.1, 0.2, 0.3) = 0.25 → tokens 0, 1 are silenced; K = {2, 3}
    b = dict(
        old_log_probs=torch.tensor([[math.log(0.05)] * 3 + [math.log(0.5)]]),
        entropy=torch.tensor([[0.1, 0.2, 0.3, 0.05]]),
        advantages=torch.tensor([[1.0, 1.0, 1.0, 1.0]]),
        response_mask=torch.ones(1, 4, dtype=torch.bool),
    )
    b["log_prob"] = b["old_log_probs"].clone().requires_grad_()
    config = _config()
    keep, metrics = compute_stapo_loss_mask(b, config)
    assert keep.tolist() == [[False, False, True, True]]
    assert metrics["actor/stapo/tau_h"] == pytest.approx(0.25)
    assert metrics["actor/stapo/num_masked"] == 2.0
    loss, _ = _loss(compute_policy_loss_stapo, b, keep, config, "token-mean", batch_num_tokens=int(keep.sum()))
    # token-mean over K: −(1·1 + 1·1) / 2
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    # d loss / d log_prob_t = −Â·ratio / |K| on kept tokens, 0 on silenced ones
    assert b["log_prob"].grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5, -0.5])


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("with_weights", [False, True])
def test_equals_vanilla_when_nothing_is_masked(mode, with_weights):
    b = _mini_batch()
    config = _config(tau_p=1e-12)  # no token has p < τ_p: K = response_mask
    keep, metrics = compute_stapo_loss_mask(b, config)
    assert torch.equal(keep, b["response_mask"]) and metrics["actor/stapo/num_masked"] == 0.0
    weights = torch.rand(4, 6, generator=torch.Generator().manual_seed(3)) + 0.5 if with_weights else None
    info = dict(batch_num_tokens=int(keep.sum()), global_batch_size=4, dp_size=1)
    loss_s, m_s = _loss(compute_policy_loss_stapo, b, keep, config, mode, weights=weights, **info)
    (grad_s,) = torch.autograd.grad(loss_s, b["log_prob"])
    loss_v, m_v = _loss(compute_policy_loss_vanilla, b, b["response_mask"], config, mode, weights=weights, **info)
    (grad_v,) = torch.autograd.grad(loss_v, b["log_prob"])
    torch.testing.assert_close(loss_s, loss_v, rtol=0, atol=0)
    torch.testing.assert_close(grad_s, grad_v, rtol=0, atol=0)
    assert m_s == m_v


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batch_split_invariance(mode):
    """The mask is computed once per mini-batch, so the summed micro-batch losses equal the whole-batch loss."""
    b = _mini_batch(seed=1)
    config = _config(q=0.5)
    keep, metrics = compute_stapo_loss_mask(b, config)
    assert 0 < metrics["actor/stapo/num_masked"] < int(b["response_mask"].sum())
    info = dict(batch_num_tokens=int(keep.sum()), global_batch_size=4, dp_size=1)
    whole, _ = _loss(compute_policy_loss_stapo, b, keep, config, mode, **info)
    for split in ([slice(0, 2), slice(2, 4)], [slice(i, i + 1) for i in range(4)]):
        parts = sum(_loss(compute_policy_loss_stapo, b, keep, config, mode, rows=r, **info)[0] for r in split)
        torch.testing.assert_close(parts, whole)
    # and it equals vanilla evaluated on the kept tokens with the kept-token count
    vanilla, _ = _loss(compute_policy_loss_vanilla, b, keep, config, mode, **info)
    torch.testing.assert_close(whole, vanilla)


def test_rollout_is_weights_are_honoured():
    b = _mini_batch(seed=2)
    config = _config(q=0.5)
    keep, _ = compute_stapo_loss_mask(b, config)
    info = dict(batch_num_tokens=int(keep.sum()), dp_size=1)
    ones, _ = _loss(compute_policy_loss_stapo, b, keep, config, "token-mean", **info)
    twos, _ = _loss(compute_policy_loss_stapo, b, keep, config, "token-mean", weights=torch.full((4, 6), 2.0), **info)
    torch.testing.assert_close(twos, 2 * ones)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_non_finite_old_policy_values_are_dropped_without_nan(mode):
    b = _mini_batch(seed=4)
    b["old_log_probs"][0, 1] = float("nan")
    b["entropy"][2, 0] = float("inf")
    config = _config(q=0.5)
    keep, metrics = compute_stapo_loss_mask(b, config)
    assert metrics["actor/stapo/nonfinite_tokens"] == 2.0 and not keep[0, 1] and not keep[2, 0]
    info = dict(batch_num_tokens=int(keep.sum()), global_batch_size=4, dp_size=1)
    loss, _ = _loss(compute_policy_loss_stapo, b, keep, config, mode, **info)
    (grad,) = torch.autograd.grad(loss, b["log_prob"])
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad[0, 1] == 0 and grad[2, 0] == 0


def test_missing_entropy_names_the_field_and_the_cause():
    b = _mini_batch()
    del b["entropy"]
    with pytest.raises(KeyError, match="entropy.*bypass_mode"):
        compute_stapo_loss_mask(b, _config())


def test_pre_pass_through_the_worker_helper_writes_the_keep_mask():
    b = _mini_batch(seed=5)
    config = _config(q=0.5)
    expected, _ = compute_stapo_loss_mask(b, config)
    lengths = b["response_mask"].sum(-1).tolist()

    def nested(t):
        return torch.nested.as_nested_tensor([row[:n] for row, n in zip(t, lengths, strict=True)], layout=torch.jagged)

    mask = nested(b["response_mask"].long())
    data = TensorDict(
        {
            "response_mask": mask,
            "loss_mask": mask,
            "old_log_probs": nested(b["old_log_probs"]),
            "advantages": nested(b["advantages"]),
            "entropy": nested(b["entropy"]),
        },
        batch_size=[4],
    )
    metrics = apply_policy_loss_mask(config, data)
    n_keep = int(expected.sum())
    assert int(data["loss_mask"].values().sum()) == n_keep
    assert metrics["actor/stapo/renorm_factor"] == pytest.approx(sum(lengths) / n_keep)
    rows = [row[:n].long().tolist() for row, n in zip(expected, lengths, strict=True)]
    assert [t.tolist() for t in data["loss_mask"].unbind()] == rows
    assert [t.tolist() for t in data["response_mask"].unbind()] == rows
