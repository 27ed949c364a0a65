"""Driver-side wrappers of ``verl.utils.config.validate_config`` and ``verl.trainer.main_ppo.run_ppo`` (ledger:
:data:`..PATCHES`): for a job that asks, they fill ``policy_loss._target_`` (:mod:`.policy_loss.checks`) on the
``DictConfig`` Ray then ships, and set :data:`.job.OPT_INS_ENV` to the options asked for before Ray starts. A job that
asks for nothing gets verl's function, its arguments and its result, its config untouched.
"""

from __future__ import annotations

import functools
import os

# verl is imported where it is used: a process whose first import is this module must not start verl's plugin
# loading (which imports this module) before the functions below exist.

_MARK = "__stapo_integration__"


def _asks(config) -> bool:
    """Gate the options ``config`` asks for, set (or clear) :data:`.job.OPT_INS_ENV`; whether it asks for a mask."""
    from stapo_verl.integration.verl_0_9_1.job import OPT_INS, OPT_INS_ENV, asks_for_extras, job_request

    request = job_request(config)  # also checks trainer.reproducible's type, before Ray
    names = tuple(name for name in OPT_INS if getattr(request, name))
    policy_loss = config.get("actor_rollout_ref", {}).get("actor", {}).get("policy_loss", None)
    for name in names + (("extras",) if policy_loss is not None and asks_for_extras(policy_loss) else ()):
        from stapo_verl.integration.verl_0_9_1.opt_in_ledger import check_opt_in  # only when an option is asked

        check_opt_in(name, f"the option {name!r} of stapo-verl")
    if names:
        os.environ[OPT_INS_ENV] = ",".join(names)
        _ship_to_ray(config, OPT_INS_ENV, ",".join(names))
    else:
        os.environ.pop(OPT_INS_ENV, None)
    return request.masked


def _ship_to_ray(config, name: str, value: str) -> None:
    """Set ``ray_kwargs.ray_init.runtime_env.env_vars.<name>`` for ``run_ppo``'s ``ray.init``: a cluster started
    before the job (``ray start``, ``RAY_ADDRESS``) does not inherit the driver's environment."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}", value, force_add=True)


def _before(config, symbol: str, validate: bool) -> None:
    """For a job that asks: record the ledger's ``symbol`` acting and fill ``_target_`` (``validate``: and check)."""
    if _asks(config):
        from stapo_verl.integration.verl_0_9_1.job import record_acted
        from stapo_verl.integration.verl_0_9_1.policy_loss import checks

        record_acted(symbol)
        (checks.validate_token_mask_config if validate else checks.fill_policy_loss_target)(config)


def wrap_validate_config(orig):
    """``validate_config`` that fills ``_target_`` and checks the token-mask keys before ``orig``."""

    @functools.wraps(orig)
    def validate_config(config, *args, **kwargs):
        _before(config, "verl.utils.config.validate_config", validate=True)
        return orig(config, *args, **kwargs)

    setattr(validate_config, _MARK, True)
    return validate_config


def wrap_run_ppo(orig):
    """``run_ppo(config, task_runner_class)`` that fills ``_target_`` before Ray ships ``config``."""

    @functools.wraps(orig)
    def run_ppo(config, *args, **kwargs):
        _before(config, "verl.trainer.main_ppo.run_ppo", validate=False)
        return orig(config, *args, **kwargs)

    setattr(run_ppo, _MARK, True)
    return run_ppo


def install_validate_config() -> None:
    """Wrap ``verl.utils.config.validate_config`` (idempotent), inside ``import verl``: before ``main_ppo`` binds it."""
    import verl.utils.config as verl_config

    if not getattr(verl_config.validate_config, _MARK, False):
        verl_config.validate_config = wrap_validate_config(verl_config.validate_config)


def patch_main_ppo(module) -> None:
    """Post-import hook of ``verl.trainer.main_ppo``: wrap its ``run_ppo`` (idempotent)."""
    if not getattr(module.run_ppo, _MARK, False):
        module.run_ppo = wrap_run_ppo(module.run_ppo)
