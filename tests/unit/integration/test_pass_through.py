"""A job that asks for nothing of the plugin runs verl 0.9.1's own code: one test per wrapping entry of the ledger
(:data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

Each test drives the plugin's wrapper with the config of a job that asks for nothing (verl's composed
``ppo_trainer`` defaults: no ``loss_mode=stapo``, no ``token_mask``, no ``trainer.reproducible``) and a spy in place of
verl's original. The spy must receive the caller's own arguments (the same objects), the wrapper must return the
spy's result (the same object), nothing the wrapper could touch may change (config, batch, worker group, engine,
checkpoint folder), and the audit record (``STAPO_AUDIT_DIR``) stays empty. ``pytest -k pass_through`` selects them.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import os
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from stapo_verl.integration.verl_0_9_1 import determinism, driver_config, job, trainer, training_worker
from stapo_verl.integration.verl_0_9_1 import worker as worker_patches


@pytest.fixture(scope="module")
def plain_config():
    """verl's ``ppo_trainer`` config composed with no override: a job that asks for nothing."""
    from stapo_verl.launch.compose import compose_config

    return compose_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])


def _merged(config, values: dict):
    """``config`` with ``values`` merged in (new keys allowed, as a ``+key=value`` override adds them)."""
    out = copy.deepcopy(config)
    OmegaConf.set_struct(out, False)
    out.merge_with(values)
    return out


@pytest.fixture(autouse=True)
def audit(tmp_path, monkeypatch):
    directory = tmp_path / "audit"
    directory.mkdir()
    monkeypatch.setenv(job.AUDIT_ENV, str(directory))
    return directory


class Spy:
    """verl's original: records its arguments, returns a fresh sentinel."""

    def __init__(self, check=None):
        self.calls, self.result, self.check = [], object(), check

    def __call__(self, *args, **kwargs):
        if self.check is not None:
            self.check(*args, **kwargs)
        self.calls.append((args, kwargs))
        return self.result


def _same(call, args, kwargs):
    """The spy got exactly these objects."""
    got_args, got_kwargs = call
    assert len(got_args) == len(args) and all(a is b for a, b in zip(got_args, args))
    assert got_kwargs.keys() == kwargs.keys() and all(got_kwargs[k] is kwargs[k] for k in kwargs)


def test_the_plain_config_asks_for_nothing(plain_config):
    assert job.job_request(plain_config) == job.JobRequest()
    asking = _merged(plain_config, {"trainer": {"reproducible": True}})
    assert job.job_request(asking) == job.JobRequest(reproducible=True)


def test_pass_through_validate_config(plain_config, audit):
    config, before = plain_config.copy(), copy.deepcopy(plain_config)
    spy = Spy()
    out = driver_config.wrap_validate_config(spy)(config, True, False, extra="kw")
    assert out is spy.result and len(spy.calls) == 1
    _same(spy.calls[0], (config, True, False), {"extra": "kw"})
    assert config == before and os.listdir(audit) == []


def test_pass_through_run_ppo(plain_config, audit):
    config, before = plain_config.copy(), copy.deepcopy(plain_config)
    spy, runner = Spy(), object()
    out = driver_config.wrap_run_ppo(spy)(config, runner)
    assert out is spy.result
    _same(spy.calls[0], (config, runner), {})
    assert config == before and os.listdir(audit) == []


def _actor_config(plain_config):
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(plain_config.actor_rollout_ref.actor)


def test_pass_through_train_batch_and_the_engines_optimizer_step(plain_config, audit):
    """No pre-pass, no cursor, no field added to the mini-batch, and the engine's optimizer_step is the engine's own
    during verl's body (the FSDP and Megatron optimizer_step entries wrap it only for a job with a mask)."""
    import torch
    from tensordict import TensorDict
    from verl.workers.utils.losses import ppo_loss

    step = Spy()
    engine = SimpleNamespace(optimizer_step=step)
    worker = SimpleNamespace(loss_fn=functools.partial(ppo_loss, config=_actor_config(plain_config)), engine=engine)
    data = TensorDict({"response_mask": torch.ones(2, 3)}, batch_size=[2])
    keys = set(data.keys(include_nested=True))
    spy = Spy(check=lambda self, d: (self.engine.__dict__["optimizer_step"] is step) or pytest.fail("wrapped"))
    assert worker_patches.wrap_train_batch(spy)(worker, data) is spy.result
    _same(spy.calls[0], (worker, data), {})
    assert set(data.keys(include_nested=True)) == keys and set(vars(worker)) == {"loss_fn", "engine"}
    assert os.listdir(audit) == []


def test_pass_through_set_loss_fn_and_init_model(plain_config, audit):
    """Without a pre-pass, TrainingWorker.set_loss_fn and ActorRolloutRefWorker.set_loss_fn are verl's; init_model
    returns verl's result and hands the actor nothing."""
    actor = SimpleNamespace()
    spy = Spy()
    loss = object()
    assert worker_patches.replace_set_loss_fn(spy, "TrainingWorker")(actor, loss) is spy.result
    _same(spy.calls[0], (actor, loss), {})
    assert vars(actor) == {}
    worker = SimpleNamespace(actor=actor)
    spy = Spy()
    assert worker_patches.replace_set_loss_fn(spy, "ActorRolloutRefWorker")(worker, loss) is spy.result
    _same(spy.calls[0], (worker, loss), {})
    actor.set_loss_fn = Spy()
    worker = SimpleNamespace(actor=actor, config=plain_config.actor_rollout_ref, loss_fn=loss)
    spy = Spy()
    assert worker_patches.wrap_init_model(spy, verl_ppo_loss=None)(worker) is spy.result
    _same(spy.calls[0], (worker,), {})
    assert actor.set_loss_fn.calls == [] and worker.loss_fn is loss
    assert os.listdir(audit) == []


def _trainer(config, tmp_path):
    config = _merged(config, {"trainer": {"default_local_dir": str(tmp_path / "ckpt")}})
    group = SimpleNamespace()
    group.update_actor = Spy()
    return SimpleNamespace(config=config, actor_rollout_wg=group, global_steps=3, total_training_steps=10,
                           logger=None)


def test_pass_through_update_actor(plain_config, tmp_path, audit):
    t = _trainer(plain_config, tmp_path)
    bound = t.actor_rollout_wg.update_actor
    batch, metrics = SimpleNamespace(extra_info={}), {}
    spy = Spy(check=lambda self, b, m: (self.actor_rollout_wg.update_actor is bound) or pytest.fail("wrapped"))
    assert trainer.wrap_update_actor(spy)(t, batch, metrics) is spy.result
    _same(spy.calls[0], (t, batch, metrics), {})
    assert batch.extra_info == {} and metrics == {} and "_stapo_diagnostics" not in vars(t)
    assert t.actor_rollout_wg.update_actor is bound and os.listdir(audit) == []


def test_pass_through_save_checkpoint(plain_config, tmp_path, audit):
    t = _trainer(plain_config, tmp_path)
    spy = Spy()
    assert trainer.wrap_save_checkpoint(spy)(t) is spy.result
    _same(spy.calls[0], (t,), {})
    assert not (tmp_path / "ckpt").exists() and os.listdir(audit) == []


def test_pass_through_load_checkpoint(plain_config, tmp_path, audit, capsys):
    t = _trainer(plain_config, tmp_path)
    spy = Spy()
    assert trainer.wrap_load_checkpoint(spy)(t) is spy.result
    _same(spy.calls[0], (t,), {})
    assert capsys.readouterr().out == "" and os.listdir(audit) == []


def test_pass_through_run_agent_loop(plain_config, audit):
    """No seed, whatever verl's rollout.full_determinism says (verl's server seeds those requests itself)."""
    for full_determinism in (False, True):
        config = _merged(plain_config, {"actor_rollout_ref": {"rollout": {"full_determinism":
                                                                                   full_determinism}}})
        worker = SimpleNamespace(config=config)
        seen = []

        async def orig(self, sampling_params, trajectory, **kwargs):
            seen.append((self, sampling_params, trajectory, kwargs))
            return "out"

        params, trajectory = {"temperature": 1.0}, {"step": 1, "sample_index": 0, "validate": False}
        out = asyncio.run(determinism.wrap_run_agent_loop(orig)(worker, params, trajectory, agent_name="a",
                                                                session_id=2))
        assert out == "out"
        (self, p, t, kw), = seen
        assert self is worker and p is params and t is trajectory and kw == {"agent_name": "a", "session_id": 2}
        assert params == {"temperature": 1.0}
    assert os.listdir(audit) == []


def test_pass_through_build_replay_buffer_keeps_verls_batch_order(plain_config, tmp_path, audit):
    """The ReplayBuffer entries (_select_prompt_uids, _materialize_batch) act through the buffer this builds: for a
    job without the switch the buffer is verl's, its methods the class's."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    buffer = ReplayBuffer.__new__(ReplayBuffer)
    spy = Spy()
    spy.result = buffer
    t = _trainer(plain_config, tmp_path)
    assert determinism.wrap_build_replay_buffer(spy)(t) is buffer
    _same(spy.calls[0], (t,), {})
    assert vars(buffer) == {} and os.listdir(audit) == []
    assert not hasattr(ReplayBuffer._select_prompt_uids, "__wrapped__")
    assert not hasattr(ReplayBuffer._materialize_batch, "__wrapped__")


def test_with_the_switch_the_buffer_is_ordered_and_the_audit_says_so(plain_config, tmp_path, audit):
    """The counterpart: the same wrapper acts for a job with trainer.reproducible=True, and records it."""
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    buffer = ReplayBuffer.__new__(ReplayBuffer)
    spy = Spy()
    spy.result = buffer
    t = _trainer(_merged(plain_config, {"trainer": {"reproducible": True}}), tmp_path)
    assert determinism.wrap_build_replay_buffer(spy)(t) is buffer
    assert {"_select_prompt_uids", "_materialize_batch"} <= set(vars(buffer))
    assert sorted(name.split(".", 1)[1] for name in os.listdir(audit)) == [
        "verl.trainer.ppo.v1.trainer_base.PPOTrainer._build_replay_buffer"]
    other = ReplayBuffer.__new__(ReplayBuffer)
    assert vars(other) == {}  # another instance (another job's trainer in the process) keeps verl's methods


def test_a_switch_that_is_not_a_boolean_is_one_clear_error(plain_config):
    from stapo_verl.algo.config_ranges import StapoConfigError

    config = _merged(plain_config, {"trainer": {"reproducible": "yes"}})
    with pytest.raises(StapoConfigError, match=r"trainer.reproducible='yes': allowed true or false.*Fix: "):
        driver_config.wrap_validate_config(Spy())(config, True, False)


def test_a_token_mask_with_another_loss_is_refused_naming_it():
    """The check of the options' train_batch: the masked ppo_loss passes; any other loss (distillation's) is
    refused, since the mask would silently not apply."""
    from verl.workers.utils.losses import ppo_loss

    from stapo_verl.core import losses as core_losses

    training_worker.require_masked_loss(functools.partial(core_losses.ppo_loss, config=None), "s2t")
    with pytest.raises(training_worker.TokenMaskIntegrationError, match=r"token_mask='s2t'.*would not be applied"):
        training_worker.require_masked_loss(functools.partial(ppo_loss, config=None), "s2t")


def _masked_actor(plain_config, **policy_loss):
    """verl's ActorConfig of a masked job built as verl's init_model builds it (the plugin's config class)."""
    from verl.utils.config import omega_conf_to_dataclass

    from stapo_verl.integration.verl_0_9_1.policy_loss.config import stapo_target

    actor = _merged(plain_config.actor_rollout_ref.actor,
                    {"policy_loss": {"_target_": stapo_target(), "loss_mode": "stapo", **policy_loss}})
    return actor, omega_conf_to_dataclass(actor)


@pytest.mark.parametrize("options", [{}, {"mask_statistics": True}, {"token_mask": "s2t_random"}])
def test_init_model_gives_a_masked_actor_the_series_loss_and_mask(plain_config, audit, options):
    """A masked job's init_model: the actor's loss is the series' ppo_loss bound to verl's own ActorConfig object,
    and its mask the series' partial(apply_policy_token_mask, config) unless an option asks for StapoPrepareBatch."""
    from verl.workers.utils.losses import ppo_loss

    from stapo_verl.core import losses as core_losses

    actor_node, config = _masked_actor(plain_config, **options)
    actor = SimpleNamespace(engine_config=SimpleNamespace(use_dynamic_bsz=False, max_token_len_per_gpu=8,
                                                          micro_batch_size_per_gpu=1, use_fused_kernels=False),
                            model_config={})
    actor.set_loss_fn = lambda loss_fn: setattr(actor, "loss_fn", loss_fn)
    worker = SimpleNamespace(actor=actor, config=SimpleNamespace(actor=actor_node),
                             loss_fn=functools.partial(ppo_loss, config=config))
    worker_patches.wrap_init_model(Spy(), verl_ppo_loss=ppo_loss)(worker)
    assert worker.loss_fn.func is core_losses.ppo_loss and worker.loss_fn.keywords["config"] is config
    assert actor.loss_fn is worker.loss_fn
    if options:
        assert isinstance(actor.policy_token_mask_fn, training_worker.StapoPrepareBatch)
        assert actor.policy_token_mask_fn.config is config
    else:
        assert actor.policy_token_mask_fn.func is core_losses.apply_policy_token_mask
        assert actor.policy_token_mask_fn.args == (config,)
    assert os.listdir(audit) == [f"{os.getpid()}.verl.workers.engine_workers.ActorRolloutRefWorker.init_model"]

    worker.loss_fn = functools.partial(Spy(), config=config)  # distillation's loss: refused, naming the mask
    with pytest.raises(job.TokenMaskIntegrationError, match=r"token_mask=.*would not\s+be applied"):
        worker_patches.wrap_init_model(Spy(), verl_ppo_loss=ppo_loss)(worker)


def test_options_reach_the_ray_processes_only_when_asked(plain_config, monkeypatch):
    """validate_config on the driver names the options a job asks for in STAPO_VERL_OPT_INS (the Ray processes
    install their wrappers from it) and clears a stale value for a job that asks for none."""
    monkeypatch.setenv(job.OPT_INS_ENV, "diagnostics,reproducible")
    driver_config.wrap_validate_config(Spy())(plain_config.copy(), True, False)
    assert job.OPT_INS_ENV not in os.environ and job.opt_ins_from_env() == ()
    asking = _merged(plain_config, {"trainer": {"reproducible": True}, "actor_rollout_ref": {"actor": {
        "policy_loss": {"loss_mode": "stapo", "mask_statistics": True}}}})
    driver_config.wrap_validate_config(Spy())(asking, True, False)
    assert os.environ[job.OPT_INS_ENV] == "diagnostics,reproducible"
    assert job.opt_ins_from_env() == ("diagnostics", "reproducible")
    # and in the job's Ray runtime_env, which reaches the workers of a cluster started before the job
    assert asking.ray_kwargs.ray_init.runtime_env.env_vars[job.OPT_INS_ENV] == "diagnostics,reproducible"
    assert job.OPT_INS_ENV not in (plain_config.ray_kwargs.ray_init.get("runtime_env") or {}).get("env_vars", {})
    only_mask = _merged(plain_config, {"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "stapo"}}}})
    driver_config.wrap_validate_config(Spy())(only_mask, True, False)
    assert job.opt_ins_from_env() == ()
