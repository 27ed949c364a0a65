"""Installing the integration at plugin load (:func:`install`), after the gate of
:mod:`stapo_verl.integration.verl_0_9_1` (apart from it, so that the gate imports none of what it installs)."""

from __future__ import annotations

import logging

from stapo_verl.integration import verl_0_9_1 as gate

logger = logging.getLogger("stapo_verl.integration.verl_0_9_1")


def register_hydra_options() -> None:
    """Store the Hydra options ``actor/stapo_<engine>_actor`` (:mod:`.policy_loss.hydra_options`)."""
    from stapo_verl.integration.verl_0_9_1.policy_loss import hydra_options

    hydra_options.register()


def install() -> bool:
    """Gate, then install :data:`..PATCHES` (idempotent) and the options :data:`.job.OPT_INS_ENV` names: eager, the
    ``validate_config`` wrapper and the Hydra options; the rest as post-import hooks. On another verl (unless
    ``STAPO_ALLOW_UNSUPPORTED_VERL=1``): one warning line, nothing patched (:mod:`.unsupported`). Returns whether the
    integration is installed."""
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
    if names := opt_ins_from_env():  # the options' wrappers, only for a job that asked for them
        from stapo_verl.integration.verl_0_9_1.opt_in_ledger import install_opt_in

        for name in names:
            install_opt_in(name)
    register_hydra_options()
    return True
