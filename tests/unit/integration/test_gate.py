"""The install-time gate and the ledger of private verl patches (fast contract tests, no training)."""

import dataclasses
import warnings

import pytest

from stapo_verl.core import losses as core_losses
from stapo_verl.integration import verl_0_9_1 as integ
from stapo_verl.integration.verl_0_9_1.opt_in_ledger import OPT_IN_PATCHES, all_patches
from stapo_verl.ledger import Patch
from stapo_verl.integration.verl_0_9_1 import IncompatibleVerlError, fingerprint, mismatches
from stapo_verl.integration.verl_0_9_1.unsupported import check_verl
from stapo_verl.integration.verl_0_9_1 import installer, opt_in_ledger


def test_installed_verl_matches_the_ledger():
    assert integ.installed_verl_version() == integ.VERL_VERSION == "0.9.1"
    assert mismatches() == []
    check_verl()


def test_gate_error_escapes_verls_plugin_loader():
    # verl's entry-point loop catches Exception and logs at DEBUG level: the gate must not be an Exception
    assert issubclass(IncompatibleVerlError, BaseException) and not issubclass(IncompatibleVerlError, Exception)


def test_version_mismatch_names_expected_and_found(monkeypatch):
    monkeypatch.setattr(integ, "installed_verl_version", lambda: "0.9.0")
    monkeypatch.delenv(integ.ALLOW_ENV, raising=False)
    with pytest.raises(IncompatibleVerlError, match=r"is written for verl 0\.9\.1; found verl 0\.9\.0\. Install "
                       r"verl==0\.9\.1; or, at your own risk, set STAPO_ALLOW_UNSUPPORTED_VERL=1"):
        check_verl()


def test_first_differing_symbol_is_named(monkeypatch):
    patches = list(integ.PATCHES)
    patches[1] = dataclasses.replace(patches[1], source_sha256="0" * 64)  # ppo_loss's body "changed"
    patches[2] = dataclasses.replace(patches[2], signature="(config)")  # and a later signature
    monkeypatch.setattr(integ, "PATCHES", tuple(patches))
    with pytest.raises(IncompatibleVerlError, match=r"first differing symbol: verl\.workers\.utils\.losses\.ppo_loss"):
        check_verl()
    assert len(mismatches()) == 2


def test_override_proceeds_with_a_loud_warning(monkeypatch):
    monkeypatch.setattr(integ, "installed_verl_version", lambda: "0.10.0")
    monkeypatch.setenv(integ.ALLOW_ENV, "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_verl()
    assert any("found verl 0.10.0" in str(w.message) and integ.ALLOW_ENV in str(w.message) for w in caught)


def test_fingerprints_of_missing_symbols_and_imports():
    assert fingerprint("verl.workers.engine_workers.NoSuchThing.train_batch") == (None, None)
    assert fingerprint("verl.no_such_module.f") == (None, None)
    assert fingerprint("verl.workers.engine_workers.ppo_loss") == (
        "from verl.workers.utils.losses import ppo_loss", None)
    monkey = Patch("verl.workers.engine_workers.NoSuchThing.f", "", "", "", "", "()")
    assert fingerprint(monkey.symbol)[0] is None


def test_every_ledger_entry_is_installed_and_nothing_else_is_patched():
    import verl.experimental.agent_loop.agent_loop as agent_loop
    import verl.trainer.main_ppo as main_ppo
    import verl.trainer.ppo.v1.agent_loop_tq as agent_loop_tq
    import verl.trainer.ppo.v1.replay_buffer as replay_buffer
    import verl.trainer.ppo.v1.trainer_base as trainer_base
    import verl.utils.config as verl_config
    import verl.workers.engine_workers as engine_workers
    import verl.workers.utils.losses as losses
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    mark = "__stapo_integration__"
    # the masked job's wrappers (PATCHES): installed at plugin load in every process
    for method in (engine_workers.TrainingWorker.train_batch, engine_workers.TrainingWorker.set_loss_fn,
                   engine_workers.ActorRolloutRefWorker.set_loss_fn, engine_workers.ActorRolloutRefWorker.init_model,
                   verl_config.validate_config, main_ppo.run_ppo):
        assert getattr(method, mark, False), method
    # the actor's loss is swapped by init_model for a masked job only: the module-level name stays verl's
    assert engine_workers.ppo_loss is losses.ppo_loss and losses.ppo_loss is not core_losses.ppo_loss
    # the options' wrappers: installed by their own install (at plugin load when STAPO_VERL_OPT_INS names them)
    opt_in_ledger.install_opt_in("diagnostics")
    opt_in_ledger.install_opt_in("reproducible")
    for name in ("_update_actor", "_save_checkpoint", "_load_checkpoint", "_build_replay_buffer"):
        assert getattr(getattr(trainer_base.PPOTrainer, name), mark, False), name
    assert getattr(agent_loop.AgentLoopWorker._run_agent_loop, mark, False)
    assert "_run_agent_loop" not in vars(agent_loop_tq.AgentLoopWorkerTQ)  # the TQ worker inherits the wrapper
    for name in ("_select_prompt_uids", "_materialize_batch"):  # wrapped per instance, for jobs that ask only
        assert not getattr(getattr(replay_buffer.ReplayBuffer, name), mark, False), name
        assert name not in vars(replay_buffer.ReplayBufferAsync)
    # the engines' optimizer_step is wrapped per instance during one train_batch call only: the classes are verl's
    assert "optimizer_step" in vars(FSDPEngine) and "optimizer_step" in vars(MegatronEngine)
    assert not getattr(FSDPEngine.optimizer_step, mark, False) and not getattr(MegatronEngine.optimizer_step, mark,
                                                                                  False)
    # the masked job's ledger lists exactly its wrappers and the body the masked loss copies
    assert [p.symbol for p in integ.PATCHES] == [
        "verl.workers.engine_workers.TrainingWorker.train_batch",
        "verl.workers.utils.losses.ppo_loss",
        "verl.workers.engine_workers.ActorRolloutRefWorker.init_model",
        "verl.workers.engine_workers.TrainingWorker.set_loss_fn",
        "verl.workers.engine_workers.ActorRolloutRefWorker.set_loss_fn",
        "verl.utils.config.validate_config",
        "verl.trainer.main_ppo.run_ppo",
    ]
    assert {name: [p.symbol.rsplit(".", 2)[-2] + "." + p.symbol.rsplit(".", 1)[-1] for p in patches]
            for name, patches in OPT_IN_PATCHES.items()} == {
        "diagnostics": ["PPOTrainer._update_actor", "PPOTrainer._save_checkpoint", "PPOTrainer._load_checkpoint",
                        "PPOTrainer.__init__"],
        "extras": ["FSDPEngine.optimizer_step", "MegatronEngine.optimizer_step", "BaseEngine.train_batch",
                   "TrainingWorker.train_mini_batch", "TrainingWorker.infer_batch", "BaseEngine.eval_mode",
                   "BaseEngine.infer_batch", "TrainingWorker.__init__"],
        "reproducible": ["AgentLoopWorker._run_agent_loop", "AgentLoopWorkerTQ._run_prompt",
                         "ReplayBuffer._select_prompt_uids", "ReplayBuffer._materialize_batch",
                         "PPOTrainer._build_replay_buffer", "AgentLoopWorker.__init__"],
        "dryrun": ["main_ppo.main", "TaskRunnerV1.run"],
    }
    # verl's own modules are otherwise untouched: the other TrainingWorker methods are verl's
    for name in ("train_mini_batch", "infer_batch"):
        assert not getattr(getattr(engine_workers.TrainingWorker, name), mark, False)
    for p in all_patches():
        assert p.why and p.upstream and p.remove_when and p.action


def test_the_options_that_travel_to_ray_are_the_ones_with_hooks_and_ledgers():
    """job.OPT_INS (what the driver names in STAPO_VERL_OPT_INS), the installer's hooks and the options' ledgers
    name the same options: one with hooks but no name would never be installed, one named without hooks is a no-op."""
    from stapo_verl.integration.verl_0_9_1 import job

    assert tuple(opt_in_ledger.OPT_IN_HOOKS) == job.OPT_INS
    assert set(job.OPT_INS) <= set(OPT_IN_PATCHES)
