"""One place per rule: each range lives once (``stapo_verl.algo.config_ranges``), the config applies it, a mask
declares where it is registered which token-mask keys it reads, and the library functions that take the same values
accept exactly what the config accepts (same check, same message)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

import stapo_verl.plugin  # noqa: F401  (the config class checks that the plugin is loaded)
from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.algo.selections import top_entropy_keep_mask
from stapo_verl.algo.config_ranges import RANGES, check_range
from stapo_verl.core.masks import TOKEN_MASKS
from stapo_verl.integration.verl_0_9_1.policy_loss.config import (
    MASK_KEYS,
    TOKEN_MASK_KEYS,
    StapoConfigError,
    StapoPolicyLossConfig,
    stapo_target,
)
from stapo_verl.integration.verl_0_9_1.policy_loss.checks import validate_token_mask_config
from stapo_verl.diagnostics.collapse import RunningZScore
from stapo_verl.diagnostics.config import DIAGNOSTICS_RANGES
from stapo_verl.diagnostics.quadrants import quadrant_masks
from stapo_verl.diagnostics.stats import log10_p_edges, mask_statistics


def _config_error(**kw) -> str:
    with pytest.raises(StapoConfigError) as err:
        StapoPolicyLossConfig(**kw)
    return str(err.value)


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(StapoConfigError) as err:
        fn(*args, **kwargs)
    return str(err.value)


def test_the_token_mask_keys_are_keys_of_the_config_with_a_range():
    assert set(TOKEN_MASK_KEYS) <= set(StapoPolicyLossConfig.__dataclass_fields__) and set(TOKEN_MASK_KEYS) <= set(RANGES)


@pytest.mark.parametrize("token_mask", ["s2t", "s2t_full", "s2t_random", "s2t_high_entropy", "top_entropy"])
def test_only_the_keys_the_selected_mask_reads_are_checked(token_mask):
    loss_mode = "stapo" if token_mask.startswith("s2t") else "vanilla"
    bad = {"s2t_tau_p": 1.5, "s2t_entropy_quantile": 5.0, "top_entropy_ratio": 0.0}
    reads = MASK_KEYS[token_mask]
    assert reads and set(reads) <= set(TOKEN_MASK_KEYS)
    for key, value in bad.items():
        if key in reads:
            assert f"{key}={value} is out of range" in _config_error(loss_mode=loss_mode, token_mask=token_mask,
                                                                     **{key: value})
        else:  # a key this mask does not read is not checked (and not used)
            assert getattr(StapoPolicyLossConfig(loss_mode=loss_mode, token_mask=token_mask, **{key: value}),
                           key) == value


def test_without_a_token_mask_the_mask_keys_are_not_read():
    assert StapoPolicyLossConfig(loss_mode="vanilla", s2t_tau_p=5.0).s2t_tau_p == 5.0


def test_tau_p_1e_13_builds_a_config_and_runs_through_the_diagnostics():
    tau_p = 1e-13  # accepted by the config, so the histograms must accept it too (they stopped at 1e-12)
    assert StapoPolicyLossConfig(loss_mode="stapo", s2t_tau_p=tau_p).s2t_tau_p == tau_p
    edges = log10_p_edges(tau_p)
    assert edges[-1] == pytest.approx(-13.0) and edges[0] == pytest.approx(-14.0) and len(edges) == 41
    assert log10_p_edges(0.002)[0] == -12.0 and log10_p_edges(1e-10)[0] == -12.0  # unchanged where it worked
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 16, generator=g) * 2
    lp[:, ::3] = math.log(tau_p) - 1.0 - torch.rand(4, 6, generator=g) * 5  # 6 tokens a row with p < τ_p
    ent = torch.rand(4, 16, generator=g) * 3
    adv = torch.tensor([[1.0], [-1.0], [0.5], [2.0]]).expand(4, 16).contiguous()
    rm = torch.ones(4, 16, dtype=torch.bool)
    keep, metrics = s2t_keep_mask(lp, ent, adv, rm, tau_p=tau_p, q=0.75)
    stats = mask_statistics(lp, ent, adv, rm, keep, tau_p=tau_p, vocab_size=1000)
    assert metrics["actor/stapo/num_candidates"] == stats.n_candidates == 18 and metrics["actor/stapo/num_masked"] > 0
    assert stats.histograms["log10_p_adv_pos"].num == 18 and stats.histograms["log10_p_adv_neg"].num == 6
    assert stats.histograms["log10_p_adv_pos"].edges == edges and stats.histograms["log10_p_adv_pos"].high < -13


@pytest.mark.parametrize("value", [0.0, 1.0, -0.5, 1.5, float("nan")])
def test_the_histogram_refuses_what_the_config_refuses_with_its_message(value):
    assert _error(log10_p_edges, value) == _config_error(loss_mode="stapo", s2t_tau_p=value)


def test_library_preconditions_are_the_configs_check():
    h, rm = torch.rand(2, 4), torch.ones(2, 4, dtype=torch.bool)
    assert _error(top_entropy_keep_mask, h, rm, 1.5) == _config_error(loss_mode="vanilla", token_mask="top_entropy",
                                                                      top_entropy_ratio=1.5)
    lp, adv = torch.full((2, 4), -9.0), torch.ones(2, 4)
    assert _error(quadrant_masks, lp, h, adv, rm, 0.1, 0.0) == _config_error(loss_mode="stapo", s2t_entropy_quantile=0.0)
    assert _error(quadrant_masks, lp, h, adv, rm, 1.0, 0.5) == _config_error(loss_mode="stapo", s2t_tau_p=1.0)
    for window, warmup in ((3, 4), (1, 1), (5, 1)):
        assert _error(RunningZScore, window=window, warmup=warmup) == _config_error(
            loss_mode="stapo", mask_statistics=True, collapse_window=window, collapse_warmup_steps=warmup)
    defaults = StapoPolicyLossConfig()
    for ranges in (RANGES, DIAGNOSTICS_RANGES):  # every range says what it allows and admits the default
        for key, rule in ranges.items():
            assert rule.allowed and check_range(key, getattr(defaults, key), ranges) == getattr(defaults, key), key


def test_the_megatron_pipeline_rule_is_one_check_for_the_config_and_the_extra_forward(monkeypatch):
    from megatron.core import parallel_state as mpu

    from stapo_verl.minibatch.current_policy import current_policy_statistics

    cfg = OmegaConf.create({"trainer": {"use_v1": True}, "actor_rollout_ref": {"actor": {
        "strategy": "megatron", "megatron": {"pipeline_model_parallel_size": 2},
        "policy_loss": {"_target_": stapo_target(), "loss_mode": "stapo",
                        "stats_source": "current_minibatch"}}}})
    at_build = _error(validate_token_mask_config, cfg)
    engine = type("MegatronEngine", (), {"__module__": "verl.workers.engine.megatron.transformer_impl"})()
    monkeypatch.setattr(mpu, "get_pipeline_model_parallel_world_size", lambda: 2)
    at_forward = _error(current_policy_statistics, engine, SimpleNamespace(), {})
    assert at_build == at_forward and "pipeline_model_parallel_size=2" in at_build
