"""``StapoPolicyLossConfig``: the one flag, mask selection, type and range checks, naming the key."""

import pytest
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from stapo_verl.core.registry import POLICY_TOKEN_MASK_REGISTRY
from stapo_verl.integration.verl_0_9_1.policy_loss.checks import (
    RENAMED_KEYS,
    check_renamed_keys,
    fill_policy_loss_target,
)
from stapo_verl.integration.verl_0_9_1.policy_loss.config import (
    REPLACED_LOSS_MODES,
    StapoConfigError,
    StapoPolicyLossConfig,
    stapo_target,
)


def test_loss_mode_stapo_is_vanilla_plus_s2t():
    assert StapoPolicyLossConfig(loss_mode="stapo").token_mask == "s2t"
    assert StapoPolicyLossConfig(loss_mode="stapo", token_mask="s2t_random").token_mask == "s2t_random"
    with pytest.raises(StapoConfigError, match=r"token_mask='top_entropy' is not one.*loss_mode=vanilla token_mask=<mask>"):
        StapoPolicyLossConfig(loss_mode="stapo", token_mask="top_entropy")


def test_no_mask_means_no_plugin_behaviour_and_no_checks():
    pl = StapoPolicyLossConfig(loss_mode="cispo", s2t_tau_p=5.0)  # unused keys are not validated without a mask
    assert pl.token_mask is None


@pytest.mark.parametrize("old", sorted(REPLACED_LOSS_MODES))
def test_replaced_loss_modes_point_at_their_token_mask(old):
    with pytest.raises(StapoConfigError, match=f"token_mask={REPLACED_LOSS_MODES[old]}"):
        StapoPolicyLossConfig(loss_mode=old)


def test_unknown_mask_lists_the_registered_ones():
    with pytest.raises(StapoConfigError, match=r"token_mask='s2x'.*allowed \['s2t'") as err:
        StapoPolicyLossConfig(loss_mode="vanilla", token_mask="s2x")
    assert all(name in str(err.value) for name in POLICY_TOKEN_MASK_REGISTRY)


def test_unregistered_loss_mode_fails_at_construction_listing_verls_registry():
    """A misspelt loss_mode with a mask fails when the config is built, not at the first update (after Ray, the
    workers, a validation and a rollout, with the mask already applied)."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    with pytest.raises(StapoConfigError, match=r"policy_loss\.loss_mode='stapoo': allowed \[") as err:
        StapoPolicyLossConfig(loss_mode="stapoo", token_mask="s2t")
    assert str(sorted(POLICY_LOSS_REGISTRY)) in str(err.value) and "'cispo'" in str(err.value)
    for mode in ("vanilla", "cispo", "gspo", "stapo"):  # every registered loss takes a mask
        assert StapoPolicyLossConfig(loss_mode=mode, token_mask="s2t").token_mask == "s2t"


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"s2t_tau_p": 0.0}, "s2t_tau_p"),
        ({"s2t_tau_p": 1.0}, "s2t_tau_p"),
        ({"s2t_entropy_quantile": 0.0}, "s2t_entropy_quantile"),
        ({"s2t_entropy_quantile": 1.5}, "s2t_entropy_quantile"),
        ({"stats_source": "rollout"}, "stats_source"),
        ({"token_mask": "top_entropy", "top_entropy_ratio": 0.0, "loss_mode": "vanilla"}, "top_entropy_ratio"),
        ({"random_mask_seed": 1.5}, "random_mask_seed"),
        ({"dump_tokens": True, "dump_max_rows_per_step": 0}, "dump_max_rows_per_step"),
    ],
)
def test_invalid_values_name_the_key(kw, key):
    kw = {"loss_mode": "stapo", **kw}
    with pytest.raises(StapoConfigError, match=rf"actor_rollout_ref\.actor\.policy_loss\.{key}="):
        StapoPolicyLossConfig(**kw)


@pytest.mark.parametrize("key,text", [("s2t_tau_p", "0.002"), ("random_mask_seed", "7"), ("mask_statistics", "true")])
def test_a_quoted_value_is_a_string_and_refused_naming_the_key(key, text):
    # a quoted Hydra override (policy_loss.s2t_tau_p='0.002') reaches the dataclass as a string: one error line
    with pytest.raises(StapoConfigError, match=rf"policy_loss\.{key}='{text}' \(str\): allowed "):
        StapoPolicyLossConfig(loss_mode="stapo", **{key: text})


@pytest.mark.parametrize("kw", [{"s2t_tau_p": True}, {"s2t_tau_p": "abc"}, {"s2t_tau_p": "nan"}, {"s2t_entropy_quantile": [0.5]},
                                {"random_mask_seed": "1.5"}, {"random_mask_seed": 2.0}, {"random_mask_seed": True},
                                {"dump_max_rows_per_step": "0"}, {"dump_tokens": "true"}, {"dump_dir": 3},
                                {"stats_source": "current_micro_batch"}])
def test_bad_scalar_values_are_rejected_naming_the_key(kw):
    (key,) = kw
    dump = {"dump_tokens": True} if key in ("dump_max_rows_per_step", "dump_dir") else {}  # checked with the dump on
    with pytest.raises(StapoConfigError, match=rf"actor_rollout_ref\.actor\.policy_loss\.{key}="):
        StapoPolicyLossConfig(loss_mode="stapo", **dump, **kw)


def test_dump_needs_an_s2t_mask():
    with pytest.raises(StapoConfigError, match="dump_tokens=True dumps S2T candidates"):
        StapoPolicyLossConfig(loss_mode="vanilla", token_mask="top_entropy", dump_tokens=True)


@pytest.mark.parametrize("old,new", sorted(RENAMED_KEYS.items()))
def test_an_old_key_name_fails_naming_the_new_one(old, new):
    """An old key is not a field: on the driver (before Ray) it gets one line naming the new key, with the fix."""
    with pytest.raises(StapoConfigError, match=rf"policy_loss\.{old}='0\.1': the key was renamed to "
                                               rf"actor_rollout_ref\.actor\.policy_loss\.{new}\. Fix: .*{new}=0\.1"):
        check_renamed_keys(OmegaConf.create({"loss_mode": "stapo", old: "0.1"}))
    config = OmegaConf.create({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "stapo", old: 0.1}}}})
    with pytest.raises(StapoConfigError, match=rf"renamed to actor_rollout_ref\.actor\.policy_loss\.{new}\b"):
        fill_policy_loss_target(config)
    check_renamed_keys(OmegaConf.create({"loss_mode": "stapo", new: 0.1}))
