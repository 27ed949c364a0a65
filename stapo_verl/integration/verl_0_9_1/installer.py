"""Installing the integration at plugin load (:func:`install`), after the gate of
:mod:`stapo_verl.integration.verl_0_9_1` (apart from it, so that the gate imports none of what it installs)."""

from __future__ import annotations

import logging
from types import MappingProxyType

from stapo_verl.integration import verl_0_9_1 as gate

logger = logging.getLogger("stapo_verl.integration.verl_0_9_1")


def register_hydra_options() -> None:
    """Store the Hydra options ``actor/stapo_<engine>_actor`` (:mod:`.policy_loss.hydra_options`)."""
    from stapo_verl.integration.verl_0_9_1.policy_loss import hydra_options

    hydra_options.register()


def install() -> bool:
    """Gate, then install :data:`~stapo_verl.integration.verl_0_9_1.PATCHES` (idempotent) and the options
    :data:`.job.OPT_INS_ENV` names: eager, the ``validate_config`` wrapper and the Hydra options; the rest as
    post-import hooks (loading the plugin imports neither the worker stack nor ``main_ppo``). On another verl (unless
    ``STAPO_ALLOW_UNSUPPORTED_VERL=1``, then after a loud warning): one warning line, nothing patched, only
    :func:`.unsupported.register_stand_ins`. Returns whether the integration is installed."""
    problems = gate.mismatches()
    if problems:
        from stapo_verl.integration.verl_0_9_1 import unsupported

        if not gate.allowed_anyway():
            logger.warning("%s", unsupported.inactive_warning(problems))
            unsupported.register_stand_ins(register_hydra_options)
            return False
        unsupported.warn_override(problems)
    from wrapt import register_post_import_hook

    from stapo_verl.core import masks  # noqa: F401  (registers the masks and loss_mode=stapo)
    from stapo_verl.integration.verl_0_9_1 import driver_config
    from stapo_verl.integration.verl_0_9_1.job import opt_ins_from_env

    driver_config.install_validate_config()
    # "module:function" hooks: wrapt imports the module when verl's is imported, not now (a process whose first
    # import is one of them is then not asked here for a name it has not defined yet).
    here = gate.__name__
    register_post_import_hook(f"{here}.driver_config:patch_main_ppo", "verl.trainer.main_ppo")
    register_post_import_hook(f"{here}.worker:patch_engine_workers", "verl.workers.engine_workers")
    for name in opt_ins_from_env():
        install_opt_in(name)
    register_hydra_options()
    return True


#: the post-import hooks of each option of :data:`.job.OPT_INS` (installed only when a job asks for it)
OPT_IN_HOOKS = MappingProxyType({
    "diagnostics": (("verl.trainer.ppo.v1.trainer_base", "trainer:patch_trainer_base"),),
    "reproducible": (("verl.experimental.agent_loop.agent_loop", "determinism:patch_agent_loop"),
                     ("verl.trainer.ppo.v1.trainer_base", "determinism:patch_trainer_base")),
})


def install_opt_in(name: str) -> None:
    """Install the wrappers of the option ``name`` (a key of :data:`OPT_IN_HOOKS`) as post-import hooks
    (idempotent). The plugin calls it at load for the options :data:`.job.OPT_INS_ENV` names.

    Raises:
        KeyError: ``name`` is not an option.
    """
    from wrapt import register_post_import_hook

    for module, hook in OPT_IN_HOOKS[name]:
        register_post_import_hook(f"{gate.__name__}.{hook}", module)
