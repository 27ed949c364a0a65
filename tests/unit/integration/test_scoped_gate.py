"""The scoped gate in-process: on a verl the ledger was not written for (the version read from verl is replaced by
0.9.0), the plugin installs nothing and warns once, and a config that asks for it fails naming both versions.

The real other verl (the 0.9.0 wheel, ``import verl``, the recipes' dry-runs) is in
``tests/integration/integration/test_version_gate.py``.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import wrapt
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla, get_policy_loss_fn

import stapo_verl
from stapo_verl.core.masks import compute_policy_loss_stapo
from stapo_verl.integration import verl_0_9_1 as integ
from stapo_verl.integration.verl_0_9_1 import ALLOW_ENV, IncompatibleVerlError, driver_config, installer, unsupported
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoNotRegisteredError, StapoPolicyLossConfig

FOUND = f"stapo-verl {stapo_verl.__version__} is written for verl 0.9.1; found verl 0.9.0"
PL = "actor_rollout_ref.actor.policy_loss"


@pytest.fixture
def other_verl(monkeypatch):
    """verl reports 0.9.0; verl's loss registry is restored afterwards; the patchers record instead of patching."""
    monkeypatch.setattr(integ, "installed_verl_version", lambda: "0.9.0")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setitem(POLICY_LOSS_REGISTRY, "stapo", POLICY_LOSS_REGISTRY["stapo"])
    calls = []
    monkeypatch.setattr(driver_config, "install_validate_config", lambda: calls.append("validate_config"))
    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, module: calls.append(module))
    return calls


def test_install_on_another_verl_warns_once_and_patches_nothing(other_verl, caplog):
    with caplog.at_level(logging.WARNING):
        assert installer.install() is False
    lines = [r.getMessage() for r in caplog.records if FOUND in r.getMessage()]
    assert lines == [
        f"{FOUND}: the plugin stays inactive (nothing in verl is patched, no CPU platform); jobs without "
        "loss_mode=stapo or a token_mask run as without it, jobs with them fail. Install verl==0.9.1, or set "
        f"{ALLOW_ENV}=1 to load it anyway."
    ]
    assert other_verl == []  # neither the eager patch nor a post-import hook
    # verl's own losses as before; loss_mode=stapo is the version error, through verl's public registry
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    assert POLICY_LOSS_REGISTRY["stapo"] is unsupported.unsupported_verl_policy_loss
    with pytest.raises(IncompatibleVerlError, match=rf"^{PL}\.loss_mode='stapo' needs .*{FOUND}\. .*{ALLOW_ENV}=1"):
        get_policy_loss_fn("stapo")(None, None, None, None)


def test_the_override_installs_everything_with_a_loud_warning(other_verl, monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_ENV, "1")
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert installer.install() is True
    assert other_verl[0] == "validate_config" and "verl.workers.engine_workers" in other_verl
    assert POLICY_LOSS_REGISTRY["stapo"] is compute_policy_loss_stapo
    loud = f"{FOUND}. Loading it anyway because {ALLOW_ENV}=1, at your own risk"
    assert [r.getMessage() for r in caplog.records if FOUND in r.getMessage()] == [f"{loud}."]
    differences = ["verl 0.9.0 is installed; stapo-verl's integration is written for verl 0.9.1"]
    assert [str(w.message) for w in caught if FOUND in str(w.message)] == [f"{loud}. All differences: {differences}"]


@pytest.mark.parametrize("kwargs, asked", [
    ({"loss_mode": "stapo"}, "loss_mode='stapo'"),
    ({"loss_mode": "cispo", "token_mask": "top_entropy"}, "token_mask='top_entropy'"),
    ({"loss_mode": "stapo", "token_mask": "s2t_random"}, "loss_mode='stapo', token_mask='s2t_random'"),
])
def test_a_config_that_asks_for_the_plugin_names_both_versions(other_verl, monkeypatch, kwargs, asked):
    monkeypatch.setattr(integ, "installed", lambda: False)
    with pytest.raises(IncompatibleVerlError) as e:
        StapoPolicyLossConfig(**kwargs)
    assert str(e.value) == (
        f"{PL}.{asked} needs stapo-verl's verl integration, which is not loaded: {FOUND}. Install verl==0.9.1; or, "
        f"at your own risk, set {ALLOW_ENV}=1 in every process of the job (the driver and the Ray workers) to load "
        "it anyway."
    )


def test_a_config_without_mask_builds_on_another_verl(other_verl, monkeypatch):
    monkeypatch.setattr(integ, "installed", lambda: False)
    assert StapoPolicyLossConfig(loss_mode="cispo").token_mask is None


def test_first_differing_symbol_is_named_when_the_version_matches(monkeypatch):
    monkeypatch.setattr(integ, "mismatches", lambda: ["verl.trainer.main_ppo.run_ppo: not found"])
    monkeypatch.setattr(integ, "installed", lambda: False)
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(IncompatibleVerlError, match=r"found verl 0\.9\.1 \(first differing symbol: "
                                                    r"verl\.trainer\.main_ppo\.run_ppo: not found\)\. Install"):
        StapoPolicyLossConfig(loss_mode="stapo")


def test_integration_missing_on_the_right_verl_is_the_not_loaded_error(monkeypatch):
    monkeypatch.setattr(integ, "installed", lambda: False)
    with pytest.raises(StapoNotRegisteredError, match="the plugin is not loaded in this process"):
        StapoPolicyLossConfig(loss_mode="stapo")


def test_the_installed_integration_is_read_from_verl(monkeypatch):
    import verl.utils.config as verl_config

    assert integ.installed() is True  # this process loaded the plugin on verl 0.9.1
    monkeypatch.setattr(verl_config, "validate_config", getattr(verl_config.validate_config, "__wrapped__"))
    assert integ.installed() is False
