"""The masked job's touches of verl 0.9.1's private API (:data:`PATCHES`) and the version gate (install:
:mod:`.installer`; the options' ledgers: :mod:`.opt_in_ledger`).

The plugin backports an extension point verl does not have yet (``upstream/``: a policy-token-mask registry, the
pre-passes in ``TrainingWorker.train_batch``, ``ppo_loss`` applying the mask). Each entry of :data:`PATCHES` says what
is done, why, what upstream replaces it, when to remove it, and the fingerprint of the verl 0.9.1 symbol (signature;
for a body the plugin copies or relies on, the sha256 of its source). The gate runs at plugin load, before anything
is patched, reading verl's source with ``ast`` (nothing imported):

* the verl of :data:`PATCHES`: everything is installed;
* any other verl: one warning line, nothing patched (nor the CPU platform). Jobs that ask for nothing run as without
  the plugin; one that asks fails naming both versions, through public registrations only (the config class of the
  ``_target_`` checks :func:`installed`; ``loss_mode=stapo`` on verl's own config fails at its first call);
* ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: everything is installed anyway, after a loud warning listing every difference.

:class:`IncompatibleVerlError` is a ``BaseException`` because verl's plugin loader (the ``verl.plugins`` loop in
``verl/__init__.py``) catches ``Exception`` and logs it at DEBUG level.
"""

from __future__ import annotations

import logging
import os
import warnings

from stapo_verl.ledger import ALLOW_ENV, Patch, fingerprint, ledger_mismatches  # noqa: F401 (fingerprint: API)

logger = logging.getLogger(__name__)

VERL_VERSION = "0.9.1"


class IncompatibleVerlError(BaseException):
    """A job asks for the plugin, but the installed verl is not the one its patches were written for."""


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
    """The gate of one option (a key of :func:`opt_in_patches`), run on the driver when a job asks for it.

    Raises:
        IncompatibleVerlError: as :func:`check_verl`, for the option's entries. KeyError: ``name`` is no option.
    """
    _raise_unless_allowed(ledger_mismatches(opt_in_patches()[name], f"verl {VERL_VERSION}"), asked_by)


def _verl_root() -> str:
    import verl

    return os.path.dirname(os.path.abspath(verl.__file__))


def installed_verl_version() -> str:
    """verl's own version string (``verl/version/version``, what ``verl.__version__`` reads)."""
    with open(os.path.join(_verl_root(), "version", "version"), encoding="utf-8") as f:
        return f.read().strip()


def mismatches() -> list[str]:
    """Every difference between the installed verl and what :data:`PATCHES` was written for, in ledger order.

    The version comes first when it differs; then one line per symbol whose signature or source differs.
    """
    problems = []
    found = installed_verl_version()
    if found != VERL_VERSION:
        problems.append(f"verl {found} is installed; stapo-verl's integration is written for verl {VERL_VERSION}")
    return problems + ledger_mismatches(PATCHES, f"verl {VERL_VERSION}")


def allowed_anyway() -> bool:
    """True when ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: load the whole integration on a verl it was not written for."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def describe_mismatch(problems: list[str]) -> str:
    """``stapo-verl <v> is written for verl 0.9.1; found verl <found>``, and the first differing symbol when the
    version alone does not explain ``problems`` (:func:`mismatches`, non-empty)."""
    symbols = [p for p in problems if not p.startswith("verl ")]
    return (
        f"stapo-verl {_plugin_version()} is written for verl {VERL_VERSION}; found verl {installed_verl_version()}"
        + (f" (first differing symbol: {symbols[0]})" if symbols and len(symbols) == len(problems) else "")
    )


def unsupported_verl_error(asked_by: str, problems: list[str] | None = None) -> IncompatibleVerlError:
    """The :class:`IncompatibleVerlError` (returned) for ``asked_by`` (e.g. ``"...policy_loss.loss_mode='stapo'"``):
    both versions, the first differing symbol, the fix and the override; ``problems``: :func:`mismatches` if known."""
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

    Raises:
        IncompatibleVerlError: naming ``asked_by`` (:func:`unsupported_verl_error`). With
            ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` the call warns loudly (every difference listed) and returns.
    """
    _raise_unless_allowed(mismatches(), asked_by)


def _raise_unless_allowed(problems: list[str], asked_by: str) -> None:
    if problems and allowed_anyway():
        _warn_override(problems)
    elif problems:
        raise unsupported_verl_error(asked_by, problems)


def installed() -> bool:
    """Whether :func:`.installer.install` put the integration in place in this process (read from verl: the
    ``validate_config`` wrapper, its first and eager patch, carries the ``__stapo_integration__`` mark)."""
    import verl.utils.config as verl_config

    return bool(getattr(verl_config.validate_config, "__stapo_integration__", False))


def unsupported_verl_policy_loss(*args, **kwargs):
    """``loss_mode=stapo`` on a verl the plugin was not written for (registered with verl's public
    ``register_policy_loss``). Raises IncompatibleVerlError, always."""
    raise unsupported_verl_error("actor_rollout_ref.actor.policy_loss.loss_mode='stapo'")


def _plugin_version() -> str:
    from stapo_verl import __version__

    return __version__
