"""Every touch of verl 0.9.1's private API, in one place: the ledger and the version gate (install: :mod:`.installer`).

The plugin is a backport of an extension point verl does not have yet (a policy-token-mask registry, the mask
pre-pass in ``TrainingWorker.train_batch``, ``ppo_loss`` applying the mask to the policy-gradient term; see
``upstream/``). Until verl ships it, the plugin reaches into the private symbols listed in :data:`PATCHES`. Each
entry says why, what upstream replaces it, when to remove it, and the fingerprint of the verl 0.9.1 symbol it was
written against (signature; for a function whose body the plugin copies, the sha256 of its source).

The gate runs at plugin load (:func:`.installer.install`), before anything is patched. It reads verl's version and the
fingerprints from verl's source files (``ast``; nothing heavy is imported). It is scoped to the jobs that use the
plugin, because the plugin is loaded by ``import verl`` in every process of every verl job of the environment:

* the verl of :data:`PATCHES`: everything is installed;
* any other verl (version or a fingerprint differs): one warning line naming both versions, and nothing in verl is
  patched (nor is the CPU platform registered: it patches verl's private API too). ``import verl`` and every job
  that asks for neither ``loss_mode=stapo`` nor a ``token_mask`` run exactly as without the plugin. Through public
  registration APIs only (Hydra's ``ConfigStore``, verl's ``register_policy_loss``), a job that asks for the plugin
  fails naming both versions and the override: when verl builds its config (``StapoPolicyLossConfig``, the
  ``policy_loss._target_`` of the plugin's actor options that the recipes select, checks :func:`installed`), or, for
  ``loss_mode=stapo`` on verl's own ``PolicyLossConfig`` (verl 0.9 validates ``loss_mode`` nowhere before), at the
  first call of the registered ``stapo`` loss;
* ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: everything is installed anyway, after a loud warning listing every difference.

:class:`IncompatibleVerlError` derives from ``BaseException`` (like ``SystemExit``) on purpose: verl's plugin loader
(the ``verl.plugins`` entry-point loop in ``verl/__init__.py``) catches every ``Exception`` and logs it at DEBUG
level, so a job that asks for the plugin must not get an error any ``except Exception`` on its way could turn into a
silently missing plugin. Ray hands it to the driver as a ``RayTaskError`` like any other.
"""

from __future__ import annotations

import logging
import os
import warnings

from stapo_verl.ledger import ALLOW_ENV, Patch

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"


class IncompatibleVerlError(BaseException):
    """A job asks for the plugin (``loss_mode=stapo`` or a ``token_mask``), but the installed verl is not the one the
    plugin's private-API patches were written for.

    A ``BaseException`` so that verl's plugin loader, which catches ``Exception``, cannot hide it.
    """


_REMOVE = "when the installed verl contains the upstream PR named here (then drop the plugin's backport)"

PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.train_batch",
        action="replaced behind a dispatcher (worker.wrap_train_batch): a worker with a pre-pass "
        "(prepare_batch_fn or policy_token_mask_fn) runs stapo_verl.core.engine_workers.TrainingWorker.train_batch, "
        "the series' method (this body plus the pre-passes inside engine.train_mode), through the pre-pass's "
        "around_train_batch when it has one (the plugin's options); any other worker: verl's method, its own "
        "arguments and result",
        why="the pre-passes run once per optimizer mini-batch inside the engine's train mode, before the engine "
        "counts the mini-batch's tokens (batch_num_tokens) and splits it into micro-batches; the series' method is "
        "this body with those lines added, hence the source hash",
        upstream="PR A: the same method (upstream/build_series.py copies it into verl's class)",
        remove_when=_REMOVE,
        signature="(self, data: TensorDict) -> TensorDict",
        source_sha256="f771a9e32f61e691e074535ec8a0d1acf47e8d295d19b6945c3ccaff5e3e4282",
    ),
    Patch(
        symbol="verl.workers.utils.losses.ppo_loss",
        action="copied (not patched): stapo_verl.core.losses.ppo_loss is this function plus the mask",
        why="the copy must start from exactly this body: the init_model entry gives a masked actor this copy, which "
        "must be verl's loss plus the mask and nothing else",
        upstream="PR A changes this function the same way",
        remove_when=_REMOVE,
        signature="(config: ActorConfig, model_output, data: TensorDict, dp_group=None)",
        source_sha256="d7a7f4ab82c8a092467633bb9951c45697f58f3abf4c47137a8bb80ee159bfa7",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.init_model",
        action="wrapped (worker.wrap_init_model): after verl's body, when the actor's policy_loss asks for a token "
        "mask (job.asks_for_mask), the actor's loss becomes partial(stapo_verl.core.losses.ppo_loss, "
        "config=actor_config) and its policy_token_mask_fn partial(apply_policy_token_mask, actor_config) (a "
        "training_worker.StapoPrepareBatch for the plugin's options); actor_config is the one verl bound to "
        "partial(ppo_loss, config=actor_config) (the module-level name ppo_loss; distillation's loss is refused), "
        "hence the source hash",
        why="verl builds the actor's loss and config here; the series' ppo_loss applies the mask, and the worker "
        "receives the actor config as an argument of its pre-pass (the series' contract)",
        upstream="PR A: verl's ppo_loss applies the mask, and init_model sets self.actor.policy_token_mask_fn = "
        "partial(apply_policy_token_mask, actor_config) when token_mask is set",
        remove_when=_REMOVE,
        signature="(self)",
        source_sha256="8bf2619c9dbfa87754b49584fbb66f75939bbd485998d217a970859a1c9597cb",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.set_loss_fn",
        action="replaced behind a dispatcher (worker.replace_set_loss_fn, keeping verl's @register "
        "attributes): stapo_verl.core.engine_workers.TrainingWorker.set_loss_fn(loss_fn, prepare_batch_fn=None) "
        "once a pre-pass is passed or set; verl's method otherwise",
        why="the pre-pass contract of the series: the caller's prepare_batch_fn(data, *, engine, dp_group) runs on "
        "each optimizer mini-batch, before the actor's policy_token_mask_fn (core.losses.run_prepare_batch); the "
        "state it writes (prepare_batch_fn, policy_token_mask_fn) is the series' TrainingWorker attributes",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.set_loss_fn",
        action="replaced behind a dispatcher (worker.replace_actor_set_loss_fn): "
        "stapo_verl.core.engine_workers.ActorRolloutRefWorker.set_loss_fn(loss_fn, prepare_batch_fn=None) once a "
        "pre-pass is passed or the actor has one; verl's method otherwise",
        why="a recipe or another plugin sets its own pre-pass through the worker; the actor's mask "
        "(policy_token_mask_fn) is not touched, so the two compose",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.utils.config.validate_config",
        action="wrapped (driver_config.wrap_validate_config); a job without a token mask: verl's function, its own "
        "arguments and result, the config untouched",
        why="on the driver, before verl builds any config object: point policy_loss._target_ at the plugin's "
        "config class when loss_mode=stapo or a token_mask is set, then check the keys the mask depends on",
        upstream="PR A adds PolicyLossConfig.token_mask (declared in actor.yaml, validated in __post_init__), so "
        "no _target_ is needed; PR B adds s2t_tau_p/s2t_entropy_quantile, validated inline in __post_init__ when a "
        "token_mask is set, as dro_beta is. The other "
        "checks have no upstream counterpart: there a batch without the declared fields raises a KeyError naming "
        "them, and distillation works because distillation_ppo_loss calls the masked ppo_loss",
        remove_when=_REMOVE,
        signature="(config: DictConfig, use_reference_policy: bool, use_critic: bool) -> None",
    ),
    Patch(
        symbol="verl.trainer.main_ppo.run_ppo",
        action="wrapped (driver_config.wrap_run_ppo); a job without a token mask: verl's function, its own "
        "arguments and result, the config untouched",
        why="the same _target_ fill for entry points that call run_ppo without validate_config on the driver "
        "(e.g. verl.experimental.fully_async_policy)",
        upstream="nothing: with PR A there is no _target_ to fill",
        remove_when=_REMOVE,
        signature="(config, task_runner_class) -> None",
    ),
)


def opt_in_patches() -> dict:
    """The options' ledgers (:data:`.opt_in_ledger.OPT_IN_PATCHES`), imported on first use."""
    from stapo_verl.integration.verl_0_9_1.opt_in_ledger import OPT_IN_PATCHES

    return dict(OPT_IN_PATCHES)


def all_patches() -> tuple[Patch, ...]:
    """:data:`PATCHES` and every option's entries, in that order."""
    return PATCHES + tuple(p for patches in opt_in_patches().values() for p in patches)


def check_opt_in(name: str, asked_by: str) -> None:
    """The gate of one option (a key of :func:`opt_in_patches`), run when a job asks for it: raise unless its
    entries match the installed verl, or the override is set (then warn).

    Raises:
        IncompatibleVerlError: naming ``asked_by`` and the first differing symbol.
        KeyError: ``name`` is not an option.
    """
    from stapo_verl.ledger import ledger_mismatches

    problems = ledger_mismatches(opt_in_patches()[name], f"verl {VERL_VERSION}")
    if not problems:
        return
    if allowed_anyway():
        _warn_override(problems)
        return
    raise unsupported_verl_error(asked_by, problems)


def _verl_root() -> str:
    import verl

    return os.path.dirname(os.path.abspath(verl.__file__))


def installed_verl_version() -> str:
    """verl's own version string (``verl/version/version``, what ``verl.__version__`` reads)."""
    with open(os.path.join(_verl_root(), "version", "version"), encoding="utf-8") as f:
        return f.read().strip()


def fingerprint(symbol: str) -> tuple[str | None, str | None]:
    """``(signature, source sha256)`` of a verl symbol, read from verl's source with ``ast`` (nothing imported).

    Returns ``(None, None)`` when the module or the symbol does not exist. A name bound by ``from … import`` gives
    that import statement as its signature and no hash.
    """
    from stapo_verl.ledger import fingerprint as source_fingerprint

    return source_fingerprint(symbol)


def mismatches() -> list[str]:
    """Every difference between the installed verl and what :data:`PATCHES` was written for, in ledger order.

    The version comes first when it differs; then one line per symbol whose signature or source differs.
    """
    problems = []
    found = installed_verl_version()
    if found != VERL_VERSION:
        problems.append(f"verl {found} is installed; stapo-verl's integration is written for verl {VERL_VERSION}")
    from stapo_verl.ledger import ledger_mismatches

    return problems + ledger_mismatches(PATCHES, f"verl {VERL_VERSION}")


def allowed_anyway() -> bool:
    """True when ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: load the whole integration on a verl it was not written for."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def describe_mismatch(problems: list[str]) -> str:
    """``stapo-verl <version> is written for verl 0.9.1; found verl <found>`` and, when the version alone does not
    explain it, the first symbol of :data:`PATCHES` that differs.

    Args:
        problems: the output of :func:`mismatches` (non-empty).
    """
    symbols = [p for p in problems if not p.startswith("verl ")]
    return (
        f"stapo-verl {_plugin_version()} is written for verl {VERL_VERSION}; found verl {installed_verl_version()}"
        + (f" (first differing symbol: {symbols[0]})" if symbols and len(symbols) == len(problems) else "")
    )


def unsupported_verl_error(asked_by: str, problems: list[str] | None = None) -> IncompatibleVerlError:
    """The error for a job that asks for the plugin on a verl the plugin was not written for (returned, not raised).

    Args:
        asked_by: what asked for the plugin, e.g. ``"actor_rollout_ref.actor.policy_loss.loss_mode='stapo'"``.
        problems: :func:`mismatches` when already computed.

    Returns:
        :class:`IncompatibleVerlError` naming ``asked_by``, both verl versions (and the first differing symbol), the
        fix and the override ``STAPO_ALLOW_UNSUPPORTED_VERL=1``.
    """
    problems = mismatches() if problems is None else problems
    return IncompatibleVerlError(
        f"{asked_by} needs stapo-verl's verl integration, which is not loaded: {describe_mismatch(problems)}. "
        f"Install verl=={VERL_VERSION}; or, at your own risk, set {ALLOW_ENV}=1 in every process of the job (the "
        "driver and the Ray workers) to load it anyway."
    )


def _inactive_warning(problems: list[str]) -> str:
    return (
        f"{describe_mismatch(problems)}: the plugin stays inactive (nothing in verl is patched, no CPU platform); "
        f"jobs without loss_mode=stapo or a token_mask run as without it, jobs with them fail. Install "
        f"verl=={VERL_VERSION}, or set {ALLOW_ENV}=1 to load it anyway."
    )


def _warn_override(problems: list[str]) -> None:
    message = f"{describe_mismatch(problems)}. Loading it anyway because {ALLOW_ENV}=1, at your own risk"
    warnings.warn(f"{message}. All differences: {problems}", stacklevel=3)
    logger.warning("%s.", message)


def check_verl(asked_by: str = "this job") -> None:
    """The gate: raise unless the installed verl matches :data:`PATCHES` or the override is set.

    Args:
        asked_by: what needs the integration (named first in the error).

    Raises:
        IncompatibleVerlError: the version or a fingerprint differs and ``STAPO_ALLOW_UNSUPPORTED_VERL`` is not
            ``1`` (:func:`unsupported_verl_error`). With the override the call warns loudly (``warnings`` and the
            log, every difference listed) and returns.
    """
    problems = mismatches()
    if not problems:
        return
    if allowed_anyway():
        _warn_override(problems)
        return
    raise unsupported_verl_error(asked_by, problems)


def installed() -> bool:
    """Whether :func:`.installer.install` put the integration in place in this process.

    Read from verl itself: the ``verl.utils.config.validate_config`` wrapper is the first, eager patch of the full
    install and carries the ``__stapo_integration__`` mark; on a verl the plugin was not written for it is absent.
    """
    import verl.utils.config as verl_config

    return bool(getattr(verl_config.validate_config, "__stapo_integration__", False))


def unsupported_verl_policy_loss(*args, **kwargs):
    """``loss_mode=stapo`` on a verl the plugin was not written for (registered with verl's public
    ``verl.trainer.ppo.core_algos.register_policy_loss``; verl looks the loss up at its first call in the actor).

    Raises:
        IncompatibleVerlError: always (:func:`unsupported_verl_error`).
    """
    raise unsupported_verl_error("actor_rollout_ref.actor.policy_loss.loss_mode='stapo'")


def _plugin_version() -> str:
    from stapo_verl import __version__

    return __version__
