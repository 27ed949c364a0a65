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
"""STAPO's S2T mask as the policy token mask ``s2t``: through the pre-pass and ``ppo_loss``, and its config keys.

Mini-batches use the layout ``TrainingWorker.train_batch`` receives (nested response fields, one prompt token).
"""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

import verl
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import get_policy_loss_fn, get_policy_token_mask
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig
from verl.workers.utils.losses import apply_policy_token_mask, ppo_loss

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


def _actor_config(loss_mode="vanilla", token_mask="s2t", **policy_loss):
    return ActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, token_mask=token_mask, **policy_loss),
        rollout_n=1,
    )


def _nested(x, lens):
    return torch.nested.as_nested_tensor([x[i, :n] for i, n in enumerate(lens)], layout=torch.jagged)


def _mini_batch(old_log_probs, entropy, advantages, response_mask):
    """The mini-batch as train_batch receives it, from padded (bs, T) tensors (valid tokens first in each row)."""
    lens = response_mask.sum(-1).tolist()
    bs, t = response_mask.shape
    fields = dict(
        prompts=_nested(torch.ones(bs, 1, dtype=torch.int64), [1] * bs),
        responses=_nested(torch.ones(bs, t, dtype=torch.int64), lens),
        response_mask=_nested(response_mask.long(), lens),
        old_log_probs=_nested(old_log_probs, lens),
        entropy=_nested(entropy, lens),
        advantages=_nested(advantages, lens),
    )
    return TensorDict(fields, batch_size=[bs])


def _loss(config, td, log_prob):
    """``ppo_loss`` on the whole mini-batch as one micro-batch; returns the loss and d loss / d log_prob."""
    log_prob = log_prob.clone().requires_grad_(True)
    lens = td["responses"].offsets().diff().tolist()
    rows = [torch.cat([log_prob[i, :n], log_prob.new_zeros(1)]) for i, n in enumerate(lens)]
    model_output = {"log_probs": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=int(td["response_mask"].values().sum()))
    tu.assign_non_tensor(td, global_batch_size=td.batch_size[0])
    loss, _ = ppo_loss(config, model_output, td)
    loss.backward()
    return loss.detach(), log_prob.grad


def _closed_form_batch():
    """Row 0 (Â = +2): p = [1e-3, .5, 1e-4, 1e-3], H = [.5, 1, .1, .9]; row 1 (Â = -1): 3 tokens and a pad.

    Candidates (Â > 0, p < 0.002): H = {.5, .1, .9}; τ_h = Quantile_0.75 = .5 + .5·(.9 − .5) = .7, so tokens 0 and 2
    of row 0 are silenced.
    """
    p = torch.tensor([[1e-3, 0.5, 1e-4, 1e-3], [0.3, 0.3, 0.3, 1.0]], dtype=torch.float64)
    entropy = torch.tensor([[0.5, 1.0, 0.1, 0.9], [0.2, 0.2, 0.2, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[2.0] * 4, [-1.0] * 3 + [0.0]], dtype=torch.float64)
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    return p.log(), entropy, advantages, response_mask


def test_s2t_is_registered_with_the_fields_it_reads():
    fn, required_fields = get_policy_token_mask("s2t")
    assert fn.__name__ == "compute_s2t_token_mask"
    assert required_fields == ("old_log_probs", "entropy", "advantages", "response_mask")


def test_closed_form_loss_and_gradient_with_vanilla():
    old, entropy, advantages, response_mask = _closed_form_batch()
    td = _mini_batch(old, entropy, advantages, response_mask)
    config = _actor_config()
    metrics = apply_policy_token_mask(config, td)
    assert td["policy_loss_mask"].to_padded_tensor(0).tolist() == [[0, 1, 0, 1], [1, 1, 1, 0]]
    assert tu.get(td, "policy_batch_num_tokens") == 5
    assert metrics["actor/stapo/tau_h"] == pytest.approx(0.7)
    assert metrics["actor/stapo/num_masked"] == 2 and metrics["actor/stapo/num_candidates"] == 3
    assert metrics["actor/stapo/renorm_factor"] == pytest.approx(7 / 5)
    # ratio 1 everywhere: kept row-0 tokens contribute −2 each, row-1 tokens +1 each, over Σ K = 5 (vanilla: 7)
    loss, grad = _loss(config, td, old)
    assert loss.item() == pytest.approx(-0.2)
    expected = torch.tensor([[0.0, -0.4, 0.0, -0.4], [0.2, 0.2, 0.2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected)
    plain_loss, _ = _loss(_actor_config(token_mask=None), _mini_batch(old, entropy, advantages, response_mask), old)
    assert plain_loss.item() == pytest.approx(-5 / 7)


def test_s2t_in_front_of_cispo_is_cispo_on_the_kept_tokens():
    g = torch.Generator().manual_seed(0)
    response_mask = torch.arange(6) < torch.tensor([[6], [4], [5], [6]])
    old = torch.where(torch.rand(4, 6, generator=g) < 0.4, torch.tensor(-9.0), -torch.rand(4, 6, generator=g))
    old, entropy = old.double() * response_mask, torch.rand(4, 6, generator=g, dtype=torch.float64) * response_mask
    advantages = torch.tensor([[1.0], [-0.5], [2.0], [0.7]], dtype=torch.float64).expand(4, 6) * response_mask
    log_prob = old + 0.2 * torch.randn(4, 6, generator=g, dtype=torch.float64) * response_mask
    td = _mini_batch(old, entropy, advantages, response_mask)
    config = _actor_config("cispo")
    metrics = apply_policy_token_mask(config, td)
    keep = td["policy_loss_mask"].to_padded_tensor(0).bool()
    assert metrics["actor/stapo/num_masked"] == int((response_mask & ~keep).sum()) > 0
    loss, grad = _loss(config, td, log_prob)
    oracle_config = _actor_config("cispo", token_mask=None)
    oracle_config.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(keep.sum()), global_batch_size=4, loss_scale_factor=None
    )
    leaf = log_prob.clone().requires_grad_(True)
    oracle, _ = get_policy_loss_fn("cispo")(
        old_log_prob=old,
        log_prob=leaf,
        advantages=advantages,
        response_mask=keep,
        loss_agg_mode="token-mean",
        config=oracle_config,
    )
    oracle.backward()
    torch.testing.assert_close(loss, oracle.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-12, atol=1e-12)


def test_a_batch_without_entropy_is_refused_naming_the_field():
    old, entropy, advantages, response_mask = _closed_form_batch()
    td = _mini_batch(old, entropy, advantages, response_mask)
    del td["entropy"]  # e.g. algorithm.rollout_correction.bypass_mode=True skips the old-log-prob pass
    with pytest.raises(KeyError, match=r"missing \['entropy'\]"):
        apply_policy_token_mask(_actor_config(), td)


def test_s2t_keys_default_to_the_paper_and_are_validated_only_when_s2t_is_selected(monkeypatch):
    config = PolicyLossConfig()
    assert (config.s2t_tau_p, config.s2t_entropy_quantile) == (0.002, 0.75)
    assert PolicyLossConfig(s2t_tau_p=0.0, s2t_entropy_quantile=2.0).s2t_tau_p == 0.0  # no mask: not checked
    monkeypatch.setattr(core_algos, "POLICY_TOKEN_MASK_REGISTRY", dict(core_algos.POLICY_TOKEN_MASK_REGISTRY))
    core_algos.register_policy_token_mask("another", required_fields=("response_mask",))(lambda *args: None)
    assert PolicyLossConfig(token_mask="another", s2t_tau_p=0.0).s2t_tau_p == 0.0  # another mask: not checked
    assert PolicyLossConfig(token_mask="s2t", s2t_tau_p=0.5, s2t_entropy_quantile=1.0).s2t_entropy_quantile == 1.0
    allowed = r"token_mask=s2t needs policy_loss\.s2t_tau_p in \(0, 1\) and s2t_entropy_quantile in \(0, 1\], got "
    for tau_p, quantile in ((0.0, 0.75), (1.0, 0.75), (-0.1, 0.75), (0.002, 0.0), (0.002, 1.5)):
        with pytest.raises(ValueError, match=rf"^{allowed}{tau_p} and {quantile}$"):
            PolicyLossConfig(token_mask="s2t", s2t_tau_p=tau_p, s2t_entropy_quantile=quantile)


def test_actor_yaml_declares_the_s2t_keys():
    policy_loss = OmegaConf.load(CONFIG_DIR / "actor" / "actor.yaml").policy_loss
    assert (policy_loss.s2t_tau_p, policy_loss.s2t_entropy_quantile) == (0.002, 0.75)
    for generated in sorted(CONFIG_DIR.glob("_generated_ppo*_trainer.yaml")):
        node = OmegaConf.load(generated).actor_rollout_ref.actor.policy_loss
        assert (node.s2t_tau_p, node.s2t_entropy_quantile) == (0.002, 0.75), generated.name
