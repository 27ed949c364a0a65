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
"""STAPO fields of PolicyLossConfig: defaults, validation, actor.yaml and the generated trainer configs."""

import os

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException

from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig, PolicyLossConfig


def test_defaults_are_the_papers():
    config = PolicyLossConfig()
    assert (config.stapo_tau_p, config.stapo_entropy_quantile) == (0.002, 0.75)
    assert PolicyLossConfig(stapo_entropy_quantile=1.0).stapo_entropy_quantile == 1.0


@pytest.mark.parametrize(
    "key, value",
    [
        ("stapo_tau_p", 0.0),
        ("stapo_tau_p", 1.0),
        ("stapo_tau_p", -0.1),
        ("stapo_tau_p", "0.002"),
        ("stapo_tau_p", None),
        ("stapo_tau_p", True),
        ("stapo_entropy_quantile", 0.0),
        ("stapo_entropy_quantile", 1.5),
        ("stapo_entropy_quantile", float("nan")),
    ],
)
def test_bad_values_name_the_key_and_the_range(key, value):
    with pytest.raises(ValueError, match=rf"policy_loss\.{key}=.* allowed 0 < {key} <"):
        PolicyLossConfig(loss_mode="stapo", **{key: value})


def test_actor_yaml_declares_the_keys_so_overrides_need_no_plus():
    with initialize_config_dir(config_dir=os.path.abspath("verl/trainer/config/actor"), version_base=None):
        cfg = compose(
            config_name="dp_actor",
            overrides=[
                "ppo_micro_batch_size_per_gpu=1",
                "policy_loss.loss_mode=stapo",
                "policy_loss.stapo_tau_p=0.01",
                "policy_loss.stapo_entropy_quantile=0.5",
            ],
        )
    config = omega_conf_to_dataclass(cfg)
    assert isinstance(config, FSDPActorConfig)
    assert config.policy_loss.loss_mode == "stapo"
    assert (config.policy_loss.stapo_tau_p, config.policy_loss.stapo_entropy_quantile) == (0.01, 0.5)
    with initialize_config_dir(config_dir=os.path.abspath("verl/trainer/config/actor"), version_base=None):
        bad = compose(config_name="dp_actor", overrides=["ppo_micro_batch_size_per_gpu=1", "policy_loss.stapo_tau_p=2"])
    # hydra wraps the ValueError of PolicyLossConfig.__post_init__; the message still names key and range
    with pytest.raises((ValueError, InstantiationException), match="stapo_tau_p=2 is out of range"):
        omega_conf_to_dataclass(bad)


@pytest.mark.parametrize("name", ["_generated_ppo_trainer.yaml", "_generated_ppo_megatron_trainer.yaml"])
def test_generated_trainer_configs_carry_the_defaults(name):
    with open(os.path.join("verl/trainer/config", name)) as f:
        policy_loss = yaml.safe_load(f)["actor_rollout_ref"]["actor"]["policy_loss"]
    assert (policy_loss["stapo_tau_p"], policy_loss["stapo_entropy_quantile"]) == (0.002, 0.75)
