"""``loss_mode`` alone selects STAPO: fill ``policy_loss._target_`` on the driver before the workers see it.

With ``actor_rollout_ref.actor.policy_loss.loss_mode=stapo`` (or any of :data:`stapo_verl.STAPO_LOSS_MODES`)
and nothing else, verl's ``actor.yaml`` still says ``_target_: verl.workers.config.PolicyLossConfig``, which
has none of the STAPO keys. :func:`fill_policy_loss_target` rewrites that one value, in place, to
:data:`STAPO_TARGET`, so every later ``omega_conf_to_dataclass`` (verl's ``validate_config`` on the driver,
``ActorRolloutRefWorker.init_model`` in each worker) builds a :class:`stapo_verl.config.StapoPolicyLossConfig`
with the paper's defaults. A ``_target_`` the user chose is never overwritten.

Where it runs (verl 0.9.1; every driver path of verl meets at least one, the fill is idempotent):

* ``verl.utils.config.validate_config`` — called by ``verl/trainer/main_ppo.py::main`` on the driver (for the v1
  and the legacy v0 TaskRunner) on the same ``DictConfig`` object it then passes to ``run_ppo`` →
  ``runner.run.remote(config)``, so the filled value is what Ray pickles to the TaskRunner and from there (as
  ``config.actor_rollout_ref``) to the workers. The wrapper is installed *outside*
  :func:`stapo_verl.selfcheck.install_validate_config_hook`'s, so the fill precedes the STAPO cross-key checks
  and verl's own ``ActorConfig`` construction.
* ``verl.trainer.main_ppo.run_ppo`` — for entry points that call it without ``validate_config`` on the driver
  (``verl/experimental/fully_async_policy/fully_async_main.py``; ``one_step_off_policy/main_ppo.py`` validates
  only inside its TaskRunner). Wrapped by a post-import hook when that module is imported as a module; under
  ``python -m verl.trainer.main_ppo`` the module runs as ``__main__`` and the ``validate_config`` wrapper applies.

Hydra cannot do this at composition time: a config *value* (``loss_mode``) cannot choose a defaults-list
entry. Declaring the STAPO keys (no ``+``) is the job of the ``actor/stapo_<engine>_actor`` options in
:mod:`stapo_verl.hydra_options`.
"""

from __future__ import annotations

import functools
import logging

from omegaconf import DictConfig, open_dict, read_write
from verl.workers.config.actor import PolicyLossConfig

from stapo_verl import STAPO_LOSS_MODES
from stapo_verl.config import StapoConfigError, StapoPolicyLossConfig
from stapo_verl.post_import import when_imported

logger = logging.getLogger(__name__)

#: verl 0.9.1's ``actor.yaml`` default for ``actor_rollout_ref.actor.policy_loss._target_``.
VERL_DEFAULT_TARGET = "verl.workers.config.PolicyLossConfig"
#: What :func:`fill_policy_loss_target` writes.
STAPO_TARGET = f"{StapoPolicyLossConfig.__module__}.{StapoPolicyLossConfig.__qualname__}"
_KEY = "actor_rollout_ref.actor.policy_loss"
_MAIN_PPO = "verl.trainer.main_ppo"


def _policy_loss_node(config) -> DictConfig | None:
    node = config
    for part in _KEY.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, DictConfig) else None


def _resolve(target: str):
    from hydra.utils import get_class

    try:
        return get_class(str(target))
    except Exception as e:  # ImportError, AttributeError, hydra's ValueError: all mean "not a usable class"
        raise StapoConfigError(f"{_KEY}._target_={target!r} cannot be imported: {type(e).__name__}: {e}") from e


def fill_policy_loss_target(config) -> bool:
    """Set ``policy_loss._target_`` to :data:`STAPO_TARGET` when ``loss_mode`` is ours and the target is verl's.

    Args:
        config: the full trainer config (OmegaConf ``DictConfig`` composed from ``ppo_trainer``); modified in
            place (struct and read-only flags are lifted only for this one key).
    Returns:
        True if ``_target_`` was written; False when ``loss_mode`` is not a stapo-verl mode, the config has no
        ``actor_rollout_ref.actor.policy_loss`` node, or the target already is ``StapoPolicyLossConfig`` or a
        subclass of it (a user-chosen target is left as it is).
    Raises:
        StapoConfigError: ``loss_mode`` is one of :data:`stapo_verl.STAPO_LOSS_MODES` but ``_target_`` names
            another class (not verl's ``PolicyLossConfig``, not a ``StapoPolicyLossConfig`` subclass), or a
            class that cannot be imported.
    Source: ``verl/trainer/config/actor/actor.yaml`` (``policy_loss._target_``), ``verl/utils/config.py``
    (``omega_conf_to_dataclass`` instantiates through ``_target_``).
    """
    pl = _policy_loss_node(config)
    if pl is None:
        return False
    loss_mode = pl.get("loss_mode", None)
    if loss_mode not in STAPO_LOSS_MODES:
        return False
    target = pl.get("_target_", None)
    if target == STAPO_TARGET:
        return False
    if target is not None and target != VERL_DEFAULT_TARGET:
        cls = _resolve(target)  # the same class may be spelled by another import path
        if isinstance(cls, type) and issubclass(cls, StapoPolicyLossConfig):
            return False
        if cls is not PolicyLossConfig:
            raise StapoConfigError(
                f"{_KEY}.loss_mode={loss_mode} needs {_KEY}._target_={STAPO_TARGET} (or a subclass of it), got "
                f"{target!r}. Remove the _target_ override (loss_mode alone selects STAPO) or set it to "
                f"{STAPO_TARGET}."
            )
    with read_write(pl), open_dict(pl):
        pl["_target_"] = STAPO_TARGET
    logger.info("%s.loss_mode=%s: set %s._target_=%s", _KEY, loss_mode, _KEY, STAPO_TARGET)
    return True


def wrap_validate_config(orig):
    """Return a ``validate_config`` that runs :func:`fill_policy_loss_target` on ``config`` before ``orig``."""

    @functools.wraps(orig)
    def validate_config(config, *args, **kwargs):
        fill_policy_loss_target(config)
        return orig(config, *args, **kwargs)

    validate_config.__stapo_fill_target__ = True
    return validate_config


def wrap_run_ppo(orig):
    """Return a ``run_ppo(config, task_runner_class)`` that fills ``_target_`` before Ray ships ``config``."""

    @functools.wraps(orig)
    def run_ppo(config, *args, **kwargs):
        fill_policy_loss_target(config)
        return orig(config, *args, **kwargs)

    run_ppo.__stapo_fill_target__ = True
    return run_ppo


def _patch_main_ppo(module) -> None:
    if not getattr(module.run_ppo, "__stapo_fill_target__", False):
        module.run_ppo = wrap_run_ppo(module.run_ppo)


def install() -> None:
    """Wrap ``verl.utils.config.validate_config`` (outermost) now, and ``main_ppo.run_ppo`` when imported.

    Installs :mod:`stapo_verl.selfcheck`'s wrapper first, so the fill always runs before its checks.
    Idempotent. Must run before ``verl.trainer.main_ppo`` binds ``validate_config`` (``from … import``), i.e. at
    plugin load inside ``import verl``.
    """
    import verl.utils.config as vcfg

    from stapo_verl import selfcheck

    selfcheck.install_validate_config_hook()
    if not getattr(vcfg.validate_config, "__stapo_fill_target__", False):
        vcfg.validate_config = wrap_validate_config(vcfg.validate_config)
    when_imported(_MAIN_PPO, _patch_main_ppo)
