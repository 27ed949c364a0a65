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
"""The policy-token-mask registry (core_algos) and the ``policy_loss.token_mask`` key that selects a mask."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import verl
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import get_policy_token_mask, register_policy_token_mask
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import PolicyLossConfig

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


@pytest.fixture
def registry(monkeypatch):
    """A private copy of the registry for the duration of a test."""
    monkeypatch.setattr(core_algos, "POLICY_TOKEN_MASK_REGISTRY", dict(core_algos.POLICY_TOKEN_MASK_REGISTRY))
    return core_algos.POLICY_TOKEN_MASK_REGISTRY


def keep_first_token(batch, config, dp_group=None):
    """Keep the first response token of every sequence."""
    keep = torch.zeros_like(batch["response_mask"], dtype=torch.bool)
    keep[:, 0] = True
    return keep, {"actor/keep_first/kept": float(keep.sum())}


def keep_last_token(batch, config, dp_group=None):
    """Keep the last response token of every sequence."""
    return batch["response_mask"].bool(), {}


def test_register_returns_the_function_and_records_its_fields(registry):
    assert register_policy_token_mask("first", required_fields=["response_mask"])(keep_first_token) is keep_first_token
    entry = get_policy_token_mask("first")
    assert entry == (keep_first_token, ("response_mask",))
    assert registry["first"] is entry


def test_registering_a_name_again_replaces_it_as_register_policy_loss_does(registry):
    register_policy_token_mask("first", required_fields=("response_mask",))(keep_first_token)
    register_policy_token_mask("first", required_fields=("response_mask", "advantages"))(keep_last_token)
    assert get_policy_token_mask("first") == (keep_last_token, ("response_mask", "advantages"))


def test_an_unknown_name_lists_the_registered_masks(registry):
    registry.clear()
    register_policy_token_mask("first", required_fields=("response_mask",))(keep_first_token)
    with pytest.raises(ValueError, match=r"^Unsupported policy token mask: nope\. Supported masks are: \['first'\]$"):
        get_policy_token_mask("nope")


def test_token_mask_is_validated_only_when_set(registry):
    assert PolicyLossConfig().token_mask is None  # default: no mask, nothing looked up
    registry.clear()
    assert PolicyLossConfig(token_mask=None).token_mask is None
    with pytest.raises(ValueError, match="Unsupported policy token mask: first"):
        PolicyLossConfig(token_mask="first")
    register_policy_token_mask("first", required_fields=("response_mask",))(keep_first_token)
    assert PolicyLossConfig(loss_mode="cispo", token_mask="first").token_mask == "first"


def test_actor_yaml_declares_token_mask(registry):
    register_policy_token_mask("first", required_fields=("response_mask",))(keep_first_token)
    policy_loss = OmegaConf.load(CONFIG_DIR / "actor" / "actor.yaml").policy_loss
    assert policy_loss.token_mask is None
    # the key is declared, so it is overridden without '+' and builds the dataclass
    merged = OmegaConf.merge(policy_loss, OmegaConf.from_dotlist(["token_mask=first", "loss_mode=gspo"]))
    config = omega_conf_to_dataclass(merged)
    assert isinstance(config, PolicyLossConfig) and (config.token_mask, config.loss_mode) == ("first", "gspo")
    for generated in sorted(CONFIG_DIR.glob("_generated_ppo*_trainer.yaml")):
        node = OmegaConf.load(generated).actor_rollout_ref.actor.policy_loss
        assert "token_mask" in node and node.token_mask is None, generated.name
