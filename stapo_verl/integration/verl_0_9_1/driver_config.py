"""Driver-side wrappers of ``verl.utils.config.validate_config`` and ``verl.trainer.main_ppo.run_ppo`` (ledger:
:data:`stapo_verl.integration.verl_0_9_1.PATCHES`): for a job that asks, they fill ``policy_loss._target_``
(:func:`.policy_loss.checks.fill_policy_loss_target`; ``validate_config`` also runs the cross-key checks) on the
``DictConfig`` Ray then ships, and set :data:`.job.OPT_INS_ENV` to the options asked for before Ray starts (in the
driver's environment and in the job's Ray ``runtime_env``). A job that asks for nothing gets verl's function, its
arguments and its result, its config untouched.
"""

from __future__ import annotations

import functools
import os

# stapo_verl.core (hence verl) is imported where it is used: loading the plugin imports this module, and a process
# whose first import is this module must not start verl's plugin loading before the functions below exist.

_MARK = "__stapo_integration__"


def _asks(config) -> bool:
    """Gate the options ``config`` asks for and set (or clear) :data:`.job.OPT_INS_ENV`; whether the job asks for
    a mask."""
    from stapo_verl.integration.verl_0_9_1.job import OPT_INS_ENV, asks_for_extras, job_request, opt_ins_of

    names = opt_ins_of(config)  # also checks trainer.reproducible's type, before Ray
    policy_loss = config.get("actor_rollout_ref", {}).get("actor", {}).get("policy_loss", None)
    for name in names + (("extras",) if policy_loss is not None and asks_for_extras(policy_loss) else ()):
        from stapo_verl.integration.verl_0_9_1.opt_in_ledger import check_opt_in  # only when an option is asked

        check_opt_in(name, f"the option {name!r} of stapo-verl")
    if names:
        os.environ[OPT_INS_ENV] = ",".join(names)
        _ship_to_ray(config, OPT_INS_ENV, ",".join(names))
    else:
        os.environ.pop(OPT_INS_ENV, None)
    return job_request(config).masked


def _ship_to_ray(config, name: str, value: str) -> None:
    """Set ``ray_kwargs.ray_init.runtime_env.env_vars.<name>``, which ``run_ppo``'s ``ray.init`` hands every process
    of the job, also on a cluster started before it (``ray start``, ``RAY_ADDRESS``), where the driver's own
    environment does not reach the workers."""
    from omegaconf import DictConfig, open_dict

    node = config
    for key in ("ray_kwargs", "ray_init", "runtime_env", "env_vars"):
        if not isinstance(node, DictConfig):
            return
        with open_dict(node):
            if node.get(key, None) is None:
                node[key] = {}
        node = node[key]
    with open_dict(node):
        node[name] = value


def wrap_validate_config(orig):
    """``validate_config`` that fills ``_target_`` and checks the token-mask keys before ``orig``."""

    @functools.wraps(orig)
    def validate_config(config, *args, **kwargs):
        from stapo_verl.integration.verl_0_9_1.job import record_acted

        if not _asks(config):
            return orig(config, *args, **kwargs)
        record_acted("verl.utils.config.validate_config")
        from stapo_verl.integration.verl_0_9_1.policy_loss.checks import validate_token_mask_config
        from stapo_verl.integration.verl_0_9_1.policy_loss.checks import fill_policy_loss_target

        fill_policy_loss_target(config)
        validate_token_mask_config(config)
        return orig(config, *args, **kwargs)

    setattr(validate_config, _MARK, True)
    return validate_config


def wrap_run_ppo(orig):
    """``run_ppo(config, task_runner_class)`` that fills ``_target_`` before Ray ships ``config``."""

    @functools.wraps(orig)
    def run_ppo(config, *args, **kwargs):
        from stapo_verl.integration.verl_0_9_1.job import record_acted

        if not _asks(config):
            return orig(config, *args, **kwargs)
        record_acted("verl.trainer.main_ppo.run_ppo")
        from stapo_verl.integration.verl_0_9_1.policy_loss.checks import fill_policy_loss_target

        fill_policy_loss_target(config)
        return orig(config, *args, **kwargs)

    setattr(run_ppo, _MARK, True)
    return run_ppo


def install_validate_config() -> None:
    """Wrap ``verl.utils.config.validate_config`` (idempotent). Runs inside ``import verl``, before
    ``verl.trainer.main_ppo`` binds the name with ``from verl.utils.config import validate_config``."""
    import verl.utils.config as verl_config

    if not getattr(verl_config.validate_config, _MARK, False):
        verl_config.validate_config = wrap_validate_config(verl_config.validate_config)


def patch_main_ppo(module) -> None:
    """Post-import hook of ``verl.trainer.main_ppo``: wrap its ``run_ppo`` (idempotent)."""
    if not getattr(module.run_ppo, _MARK, False):
        module.run_ppo = wrap_run_ppo(module.run_ppo)
