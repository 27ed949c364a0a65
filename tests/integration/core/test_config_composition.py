"""Config composition with verl's own Hydra config: ``loss_mode=stapo`` alone, ``token_mask`` with any loss, and
``actor@actor_rollout_ref.actor=stapo_<engine>_actor`` declaring the keys so they need no ``+``.

Everything goes through verl 0.9.1's own Hydra config dir, the ``validate_config`` bound in
``verl.trainer.main_ppo`` and ``omega_conf_to_dataclass`` (what the workers call)."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, InstantiationException
from omegaconf import OmegaConf

import verl
import verl.trainer.main_ppo as main_ppo
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig, McoreActorConfig, PolicyLossConfig

from stapo_verl.core.masks import TOKEN_MASKS
from stapo_verl.integration.verl_0_9_1.policy_loss import hydra_options
from stapo_verl.integration.verl_0_9_1.policy_loss.checks import fill_policy_loss_target, validate_token_mask_config
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError, StapoPolicyLossConfig

VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
PL = "actor_rollout_ref.actor.policy_loss"
OURS = "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig"
# verl's validate_config needs the micro-batch sizes a real run sets; nothing STAPO-specific.
SMALL = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"]
# The paper's values (STAPO §3, §5) and the documented defaults of the other keys, written out by hand.
PAPER_DEFAULTS = {"s2t_tau_p": 0.002, "s2t_entropy_quantile": 0.75, "stats_source": "old_policy", "top_entropy_ratio": 0.2,
                  "random_mask_seed": 0}


class MyStapoPolicyLossConfig(StapoPolicyLossConfig):
    """A user's own subclass: a ``_target_`` naming it must be kept."""


def _compose(*overrides):
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=[*SMALL, *overrides])


def _validate(cfg):
    # The name main_ppo.main calls (bound at its import, i.e. with the plugin's wrappers).
    main_ppo.validate_config(cfg, use_reference_policy=False, use_critic=False)


# ---------------------------------------------------------------- 1. loss_mode alone


def test_loss_mode_stapo_alone_builds_the_config_with_paper_defaults():
    cfg = _compose(f"{PL}.loss_mode=stapo")
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"  # as composed
    _validate(cfg)  # fill → token-mask cross-key checks → verl's checks
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == OURS
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # what ActorRolloutRefWorker.init_model does
    assert type(actor) is FSDPActorConfig
    pl = actor.policy_loss
    assert type(pl) is StapoPolicyLossConfig and (pl.loss_mode, pl.token_mask) == ("stapo", "s2t")
    assert {k: getattr(pl, k) for k in PAPER_DEFAULTS} == PAPER_DEFAULTS


@pytest.mark.parametrize("token_mask", TOKEN_MASKS)
@pytest.mark.parametrize("loss_mode", ["vanilla", "cispo", "gspo"])
def test_a_token_mask_with_any_loss_mode(loss_mode, token_mask):
    cfg = _compose(f"{PL}.loss_mode={loss_mode}", f"++{PL}.token_mask={token_mask}")
    _validate(cfg)
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert (type(pl), pl.loss_mode, pl.token_mask) == (StapoPolicyLossConfig, loss_mode, token_mask)


def test_token_mask_on_megatron():
    cfg = _compose("model_engine=megatron", f"{PL}.loss_mode=gspo", f"++{PL}.token_mask=s2t_full")
    _validate(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is McoreActorConfig and type(actor.policy_loss) is StapoPolicyLossConfig
    assert actor.policy_loss.token_mask == "s2t_full" and actor.policy_loss.s2t_tau_p == 0.002


@pytest.mark.parametrize("old,new", [("stapo_high_entropy", "s2t_high_entropy"), ("stapo_random", "s2t_random"),
                                     ("stapo_full_mask", "s2t_full"), ("top_entropy", "top_entropy")])
def test_replaced_loss_modes_name_their_token_mask(old, new):
    cfg = _compose(f"{PL}.loss_mode={old}")
    with pytest.raises(InstantiationException, match=rf"loss_mode=vanilla {PL}\.token_mask={new}"):
        _validate(cfg)


def test_other_loss_modes_are_untouched():
    for mode in ("vanilla", "gspo"):
        cfg = _compose(f"{PL}.loss_mode={mode}")
        _validate(cfg)
        assert cfg.actor_rollout_ref.actor.policy_loss._target_ == "verl.workers.config.PolicyLossConfig"
        assert type(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss) is PolicyLossConfig


def test_explicit_stapo_target_and_plus_keys_still_work():
    cfg = _compose(f"{PL}._target_={OURS}", f"+{PL}.token_mask=s2t_random", f"+{PL}.s2t_tau_p=0.05")
    assert fill_policy_loss_target(cfg) is False
    _validate(cfg)
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert (type(pl), pl.token_mask, pl.s2t_tau_p) == (StapoPolicyLossConfig, "s2t_random", 0.05)


@pytest.mark.parametrize("target_override", [f"{PL}._target_=verl.workers.config.actor.PolicyLossConfig",
                                             f"~{PL}._target_"])
def test_verl_default_by_its_module_path_or_deleted_is_filled(target_override):
    cfg = _compose(target_override, f"{PL}.loss_mode=stapo")
    assert fill_policy_loss_target(cfg) is True
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == OURS


@pytest.mark.parametrize(
    "target, msg",
    [("verl.workers.config.ActorConfig", r"needs actor_rollout_ref\.actor\.policy_loss\._target_=stapo_verl"),
     ("no_such_pkg.NoSuchConfig", r"_target_='no_such_pkg\.NoSuchConfig' cannot be imported")],
)
def test_foreign_target_with_our_loss_mode_is_an_error_not_overwritten(target, msg):
    cfg = _compose(f"{PL}._target_={target}", f"{PL}.loss_mode=stapo")
    with pytest.raises(StapoConfigError, match=msg):
        _validate(cfg)
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == target


def test_user_subclass_target_is_kept():
    target = f"{__name__}.MyStapoPolicyLossConfig"
    cfg = _compose(f"{PL}._target_={target}", f"{PL}.loss_mode=stapo")
    assert fill_policy_loss_target(cfg) is False
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == target
    assert type(omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss) is MyStapoPolicyLossConfig
    validate_token_mask_config(cfg)  # the cross-key checks accept the subclass the fill kept


def test_fill_works_on_a_read_only_config_and_keeps_it_read_only():
    cfg = _compose(f"{PL}.loss_mode=stapo")
    OmegaConf.set_readonly(cfg, True)
    assert fill_policy_loss_target(cfg) is True
    assert cfg.actor_rollout_ref.actor.policy_loss._target_ == OURS
    assert OmegaConf.is_readonly(cfg.actor_rollout_ref.actor.policy_loss)
    assert fill_policy_loss_target(cfg) is False  # idempotent


# ---------------------------------------------------------------- 2. actor/stapo_<engine>_actor


def _declared():
    return {f.name for f in dataclasses.fields(StapoPolicyLossConfig)} - {
        f.name for f in dataclasses.fields(PolicyLossConfig)}


@pytest.mark.parametrize("engine", hydra_options.ENGINES)
def test_option_is_verls_actor_plus_declared_stapo_keys(engine):
    plain = OmegaConf.to_container(_compose(f"model_engine={engine}").actor_rollout_ref.actor)
    opt_cfg = _compose(f"model_engine={engine}", f"actor@actor_rollout_ref.actor=stapo_{engine}_actor")
    opt = OmegaConf.to_container(opt_cfg.actor_rollout_ref.actor)
    pl_plain, pl_opt = plain.pop("policy_loss"), opt.pop("policy_loss")
    assert opt == plain  # every other actor key is verl's <engine>_actor, unchanged
    new = set(pl_opt) - set(pl_plain)
    assert new == _declared() and new >= set(PAPER_DEFAULTS)
    assert {k: pl_opt[k] for k in PAPER_DEFAULTS} == PAPER_DEFAULTS
    for f in dataclasses.fields(StapoPolicyLossConfig):
        if f.name in new and f.name != "token_mask":  # the option is STAPO: token_mask=s2t
            assert pl_opt[f.name] == f.default, f.name
    assert pl_opt["_target_"] == OURS and pl_opt["loss_mode"] == "stapo" and pl_opt["token_mask"] == "s2t"
    assert {k: pl_opt[k] for k in pl_plain if k not in ("_target_", "loss_mode")} == {
        k: v for k, v in pl_plain.items() if k not in ("_target_", "loss_mode")}


def test_option_keys_override_without_plus_and_s2t_goes_in_front_of_another_loss():
    cfg = _compose("actor@actor_rollout_ref.actor=stapo_dp_actor", f"{PL}.s2t_tau_p=0.01",
                   f"{PL}.s2t_entropy_quantile=0.5", f"{PL}.loss_mode=cispo")
    _validate(cfg)
    pl = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).policy_loss
    assert (type(pl), pl.loss_mode, pl.token_mask, pl.s2t_tau_p, pl.s2t_entropy_quantile) == (
        StapoPolicyLossConfig, "cispo", "s2t", 0.01, 0.5)


def test_option_selected_by_model_engine_interpolation():
    cfg = _compose("model_engine=megatron", "actor@actor_rollout_ref.actor=stapo_${model_engine}_actor",
                   f"{PL}.loss_mode=vanilla", f"{PL}.token_mask=top_entropy", f"{PL}.top_entropy_ratio=0.1")
    _validate(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert type(actor) is McoreActorConfig and actor.strategy == "megatron"
    assert type(actor.policy_loss) is StapoPolicyLossConfig and actor.policy_loss.top_entropy_ratio == 0.1


def test_option_keys_are_strict():
    with pytest.raises(ConfigCompositionException, match="tau_pp"):
        _compose("actor@actor_rollout_ref.actor=stapo_dp_actor", f"{PL}.tau_pp=0.01")
    with pytest.raises(ConfigCompositionException, match="tau_p"):  # without the option the key is undeclared
        _compose(f"{PL}.s2t_tau_p=0.01")
    with pytest.raises(InstantiationException, match=r"tau_p=1\.5 is out of range"):  # hydra wraps the error
        omega_conf_to_dataclass(_compose("actor@actor_rollout_ref.actor=stapo_dp_actor",
                                         f"{PL}.s2t_tau_p=1.5").actor_rollout_ref.actor)


@pytest.mark.parametrize("old,new", [("tau_p", "s2t_tau_p"), ("entropy_quantile", "s2t_entropy_quantile")])
def test_an_old_key_name_fails_on_the_driver_naming_the_new_one(old, new):
    # no longer a field: added with +, the driver's check (before Ray) names the new key in one line
    cfg = _compose("actor@actor_rollout_ref.actor=stapo_dp_actor", f"+{PL}.{old}=0.01")
    with pytest.raises(StapoConfigError, match=rf"{PL}\.{old}=0\.01: the key was renamed to {PL}\.{new}\b"):
        _validate(cfg)


def test_keys_are_derived_from_the_dataclass(monkeypatch):
    @dataclasses.dataclass
    class Later(StapoPolicyLossConfig):
        new_knob: float = 0.5
        new_list: list = dataclasses.field(default_factory=lambda: [1, 2])

    monkeypatch.setattr(hydra_options, "StapoPolicyLossConfig", Later)
    keys = hydra_options.stapo_policy_loss_keys()
    assert keys["new_knob"] == 0.5 and keys["new_list"] == [1, 2] and set(keys) == _declared() | {"new_knob", "new_list"}
    assert hydra_options.actor_option_node("dp")["defaults"] == ["dp_actor", "_self_"]
    with pytest.raises(ValueError, match="model_engine='vllm'"):
        hydra_options.option_name("vllm")


def test_main_ppo_cfg_job_in_a_fresh_process():
    # verl's own entry point (runpy, with the plugin's post-import hook on verl.trainer.main_ppo installed):
    # the option is registered by `import verl` before @hydra.main composes.
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", "--cfg", "job", "--package", PL,
           "actor@actor_rollout_ref.actor=stapo_${model_engine}_actor", f"{PL}.s2t_tau_p=0.01",
           f"{PL}.token_mask=s2t_random"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    pl = yaml.safe_load(out.stdout[out.stdout.index("# @package"):])
    assert pl["_target_"] == OURS and pl["token_mask"] == "s2t_random" and pl["s2t_tau_p"] == 0.01
    assert set(_declared()) <= set(pl) and pl["s2t_entropy_quantile"] == 0.75


def test_main_ppo_module_run_fills_before_the_stapo_checks():
    # The literal user command (runpy runs main_ppo as __main__; its validate_config is the plugin's wrapper):
    # loss_mode alone passes the _target_ check and reaches the next check, which this config fails on purpose,
    # so nothing after validate_config (ray.init, training) starts.
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *SMALL, "algorithm.adv_estimator=grpo",
           f"{PL}.loss_mode=stapo", "algorithm.rollout_correction.bypass_mode=True"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=dict(os.environ))
    assert out.returncode != 0
    assert "which algorithm.rollout_correction.bypass_mode=True skips" in out.stderr, out.stderr[-3000:]
    assert "needs actor_rollout_ref.actor.policy_loss._target_" not in out.stderr
