"""Plugin loading: the ``verl.plugins`` entry point installs the plugin in a fresh Ray worker (masks registered,
verl's worker module patched); with plugins disabled the config's self-check raises a clear error; cross-key
validation runs inside verl's ``validate_config``; with ``loss_mode=stapo`` alone, verl's ``main_ppo.main`` /
``run_ppo`` ship a config with ``_target_`` filled to a Ray worker, which builds a ``StapoPolicyLossConfig``."""

import os
import subprocess
import sys
from pathlib import Path


import pytest
import ray
from hydra import compose, initialize_config_dir

import verl
from stapo_verl.core.masks import LAB_MASKS, TOKEN_MASKS
from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoConfigError
from stapo_verl.integration.verl_0_9_1.policy_loss.checks import validate_token_mask_config

VERL_CONFIG_DIR = str(Path(verl.__file__).parent / "trainer" / "config")
OURS = "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig"
STAPO_OVERRIDES = [
    f"actor_rollout_ref.actor.policy_loss._target_={OURS}",
    "actor_rollout_ref.actor.policy_loss.loss_mode=stapo",
    "+actor_rollout_ref.actor.policy_loss.s2t_tau_p=0.002",
    "+actor_rollout_ref.actor.policy_loss.s2t_entropy_quantile=0.75",
]


def _probe():
    """Runs inside a Ray worker: what does a plain ``import verl`` give there?"""
    import sys as _sys

    import verl  # noqa: F401
    import verl.workers.engine_workers as engine_workers
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    result = {"stapo_loss": "stapo" in POLICY_LOSS_REGISTRY,
              "plugin_module_loaded": "stapo_verl.plugin" in _sys.modules, "pid": os.getpid(),
              "ppo_loss": f"{engine_workers.ppo_loss.__module__}.{engine_workers.ppo_loss.__qualname__}",
              "ppo_loss_dispatch": bool(getattr(engine_workers.ppo_loss, "__stapo_integration__", False)),
              "train_batch_patched": bool(getattr(engine_workers.TrainingWorker.train_batch,
                                                  "__stapo_integration__", False))}
    if result["plugin_module_loaded"]:
        from stapo_verl.core.registry import POLICY_TOKEN_MASK_REGISTRY

        result["masks"] = sorted(POLICY_TOKEN_MASK_REGISTRY)
    try:
        from verl.utils.config import omega_conf_to_dataclass
        from omegaconf import OmegaConf

        omega_conf_to_dataclass(OmegaConf.create({
            "_target_": "stapo_verl.integration.verl_0_9_1.policy_loss.config.StapoPolicyLossConfig",
            "loss_mode": "stapo", "token_mask": "s2t_random"}))
        result["masks_after_a_lab_mask"] = sorted(POLICY_TOKEN_MASK_REGISTRY)
        result["error"] = None
    except Exception as e:  # the self-check
        result["error"] = f"{type(e).__name__}: {e}"
    return result


@pytest.fixture(scope="module")
def local_ray():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on the workers' path
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield
    ray.shutdown()


def test_fresh_ray_worker_sees_stapo_through_entry_point_alone(local_ray):
    res = ray.get(ray.remote(_probe).options(runtime_env={"env_vars": {"VERL_USE_EXTERNAL_PLUGINS": "auto"}}).remote())
    assert res["pid"] != os.getpid()
    assert res["plugin_module_loaded"] is True and res["stapo_loss"] is True
    # the series' mask at load; the lab's masks once a config names one (a job asking for s2t never loads them)
    assert res["masks"] == ["s2t"] and res["masks_after_a_lab_mask"] == sorted(TOKEN_MASKS)
    # verl's ppo_loss stays the module's name (init_model gives a masked actor the series' loss)
    assert res["ppo_loss_dispatch"] is False and res["train_batch_patched"] is True
    assert res["error"] is None


def test_plugins_disabled_self_check_raises_clear_error(local_ray):
    env = {"env_vars": {"VERL_USE_EXTERNAL_PLUGINS": "none"}}
    res = ray.get(ray.remote(_probe).options(runtime_env=env).remote())
    assert res["plugin_module_loaded"] is False and res["train_batch_patched"] is False
    assert res["ppo_loss"] == "verl.workers.utils.losses.ppo_loss" and res["ppo_loss_dispatch"] is False
    assert "StapoNotRegisteredError" in res["error"]  # hydra wraps it in InstantiationException, as in verl
    for hint in ("plugin is not loaded in this process", "pip install stapo-verl", "VERL_USE_EXTERNAL_PLUGINS"):
        assert hint in res["error"]


def test_importing_our_config_first_still_installs_the_plugin():
    # Regression: with a core module as the process's first import, verl's plugin loading started inside the
    # half-initialised module, the circular import was swallowed, and nothing registered.
    code = (
        "import stapo_verl.integration.verl_0_9_1.policy_loss.config\n"
        "import sys\n"
        "from stapo_verl.core.registry import POLICY_TOKEN_MASK_REGISTRY as R\n"
        "print('stapo_verl.plugin' in sys.modules, sorted(R))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"})
    assert out.returncode == 0, out.stderr[-3000:]
    # the series' mask; the lab's are registered when a config names one (core.masks.LAB_MASK_MODULE)
    assert out.stdout.strip().splitlines()[-1] == f"True {sorted(set(TOKEN_MASKS) - set(LAB_MASKS))}"


def test_plugins_disabled_in_a_plain_process():
    code = (
        "import verl\n"
        "from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig\n"
        "StapoPolicyLossConfig(loss_mode='vanilla', token_mask='s2t')\n"
    )
    env = dict(os.environ, VERL_USE_EXTERNAL_PLUGINS="none")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "StapoNotRegisteredError" in out.stderr and "plugin is not loaded" in out.stderr


def _compose(extra):
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(config_name="ppo_trainer", overrides=STAPO_OVERRIDES + extra)


def test_cross_key_validation_names_the_key():
    validate_token_mask_config(_compose([]))  # default route: valid as composed
    cases = [
        (["trainer.use_v1=False"], "trainer.use_v1=True"),
        (["algorithm.rollout_correction.bypass_mode=True"], "bypass_mode"),
        (["distillation.enabled=True"], "distillation.enabled=True"),
    ]
    for extra, msg in cases:
        with pytest.raises(StapoConfigError, match=msg.replace(".", r"\.")):
            validate_token_mask_config(_compose(extra))


def test_foreign_target_fails_in_verls_validate_config():
    # loss_mode alone is filled in (test_config_composition.py); a _target_ the user chose is never replaced.
    import verl.utils.config as vcfg

    assert getattr(vcfg.validate_config, "__stapo_integration__", False)
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=stapo",
                                                            "actor_rollout_ref.actor.policy_loss._target_="
                                                            "verl.workers.config.CriticConfig"])
    with pytest.raises(StapoConfigError, match=f"_target_={OURS}"):
        vcfg.validate_config(cfg, use_reference_policy=False, use_critic=False)


# ------------------------------------------------ loss_mode alone: the config Ray ships to a worker


def _probe_runner(out_path):
    """A stand-in for verl's TaskRunner: in a Ray worker, build the actor config as ``init_model`` does."""

    class ProbeRunner:
        def run(self, config):
            import json
            import os as _os
            from pathlib import Path as _Path

            from verl.utils.config import omega_conf_to_dataclass

            actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
            pl = actor.policy_loss
            _Path(out_path).write_text(json.dumps({
                "pid": _os.getpid(), "target": config.actor_rollout_ref.actor.policy_loss._target_,
                "type": f"{type(pl).__module__}.{type(pl).__qualname__}", "loss_mode": pl.loss_mode,
                "token_mask": getattr(pl, "token_mask", None),
                "tau_p": getattr(pl, "s2t_tau_p", None), "entropy_quantile": getattr(pl, "s2t_entropy_quantile", None)}))

    return ray.remote(num_cpus=0)(ProbeRunner)


_ONE_FLAG = ["actor_rollout_ref.actor.policy_loss.loss_mode=stapo", "algorithm.adv_estimator=grpo",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"]


def _read(out):
    import json

    return json.loads(out.read_text())


def test_main_ppo_main_ships_the_filled_target_to_a_ray_worker(local_ray, monkeypatch, tmp_path):
    import verl.trainer.main_ppo as main_ppo

    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=_ONE_FLAG)
    out = tmp_path / "probe.json"
    monkeypatch.setattr(main_ppo, "TaskRunnerV1", _probe_runner(str(out)))
    main_ppo.main(cfg)  # verl's own main body (hydra passes a given config through): validate_config → run_ppo
    res = _read(out)
    assert res["pid"] != os.getpid()
    assert res["target"] == res["type"] == OURS
    assert (res["loss_mode"], res["token_mask"], res["tau_p"], res["entropy_quantile"]) == ("stapo", "s2t", 0.002,
                                                                                            0.75)


def test_run_ppo_without_validate_config_still_fills(local_ray, tmp_path):
    # verl's fully_async_main calls run_ppo without validate_config on the driver.
    import verl.trainer.main_ppo as main_ppo

    assert getattr(main_ppo.run_ppo, "__stapo_integration__", False)
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=_ONE_FLAG)
    out = tmp_path / "probe.json"
    main_ppo.run_ppo(cfg, task_runner_class=_probe_runner(str(out)))
    res = _read(out)
    assert res["type"] == OURS and res["tau_p"] == 0.002
