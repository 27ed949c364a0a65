"""The masked job's touches of verl 0.9.1's private API (:data:`PATCHES`: what, why, its upstream replacement, and the
fingerprint of the verl symbol, a signature and for a body it copies or relies on its sha256) and the version gate,
run at plugin load before anything is patched, reading verl's source with ``ast``. On the verl of :data:`PATCHES`
everything is installed (:mod:`.installer`); on any other, one warning line and nothing patched: a job that asks for
nothing runs as without the plugin, one that asks fails naming both versions (:mod:`.unsupported`), unless
``STAPO_ALLOW_UNSUPPORTED_VERL=1`` installs it anyway after a loud warning. The options' ledgers: :mod:`.opt_in_ledger`.
"""

from __future__ import annotations

import os

from stapo_verl.ledger import ALLOW_ENV, Patch, fingerprint, ledger_mismatches  # noqa: F401 (fingerprint: API)

VERL_VERSION = "0.9.1"


class IncompatibleVerlError(BaseException):
    """A job asks for the plugin, but the installed verl is not the one its patches were written for (a
    ``BaseException``: verl's plugin loader in ``verl/__init__.py`` catches ``Exception`` and logs it at DEBUG)."""


_REMOVE = "when the installed verl contains the upstream PR named here (then drop the plugin's backport)"

PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.train_batch",
        action="replaced behind a dispatcher (worker.wrap_train_batch): with a pre-pass, the series' method "
        "(core.engine_workers, or the pre-pass's around_train_batch); else verl's",
        why="the pre-passes run per optimizer mini-batch inside engine.train_mode, before the engine counts and "
        "splits it; the series' method is this body plus those lines, hence the source hash",
        upstream="PR A: the same method (upstream/build_series.py copies it into verl's class)",
        remove_when=_REMOVE,
        signature="(self, data: TensorDict) -> TensorDict",
        source_sha256="f771a9e32f61e691e074535ec8a0d1acf47e8d295d19b6945c3ccaff5e3e4282",
    ),
    Patch(
        symbol="verl.workers.utils.losses.ppo_loss",
        action="copied (not patched): stapo_verl.core.losses.ppo_loss is this function plus the mask",
        why="a masked actor's loss (the init_model entry) must be exactly verl's plus the mask",
        upstream="PR A changes this function the same way",
        remove_when=_REMOVE,
        signature="(config: ActorConfig, model_output, data: TensorDict, dp_group=None)",
        source_sha256="d7a7f4ab82c8a092467633bb9951c45697f58f3abf4c47137a8bb80ee159bfa7",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.init_model",
        action="wrapped (worker.wrap_init_model): after verl's body, a masked actor gets core.losses.ppo_loss and "
        "the mask pre-pass as its policy_token_mask_fn, on the actor config verl bound to its ppo_loss (hence the "
        "source hash)",
        why="verl builds the actor's loss and config here; the series' pre-pass takes the actor config",
        upstream="PR A: verl's ppo_loss applies the mask; init_model sets the actor's policy_token_mask_fn",
        remove_when=_REMOVE,
        signature="(self)",
        source_sha256="8bf2619c9dbfa87754b49584fbb66f75939bbd485998d217a970859a1c9597cb",
    ),
    Patch(
        symbol="verl.workers.engine_workers.TrainingWorker.set_loss_fn",
        action="replaced behind a dispatcher (worker.replace_set_loss_fn, keeping verl's @register attributes): "
        "the series' set_loss_fn(loss_fn, prepare_batch_fn=None) once a pre-pass is passed or set; else verl's",
        why="the series' pre-pass contract: prepare_batch_fn runs per optimizer mini-batch, before the mask",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.workers.engine_workers.ActorRolloutRefWorker.set_loss_fn",
        action="replaced as TrainingWorker.set_loss_fn is (worker.replace_set_loss_fn)",
        why="a recipe or another plugin sets its own pre-pass; the actor's mask stays, so the two compose",
        upstream="PR A: the same method",
        remove_when=_REMOVE,
        signature="(self, loss_fn)",
    ),
    Patch(
        symbol="verl.utils.config.validate_config",
        action="wrapped (driver_config.wrap_validate_config); a job without a token mask: verl's function",
        why="on the driver, before verl builds a config object: point policy_loss._target_ at the plugin's config "
        "class, then check the keys the mask depends on",
        upstream="PR A and PR B declare the keys in PolicyLossConfig and actor.yaml (no _target_)",
        remove_when=_REMOVE,
        signature="(config: DictConfig, use_reference_policy: bool, use_critic: bool) -> None",
    ),
    Patch(
        symbol="verl.trainer.main_ppo.run_ppo",
        action="wrapped (driver_config.wrap_run_ppo); a job without a token mask: verl's function",
        why="the same _target_ fill for entry points that skip validate_config (verl.experimental.fully_async_policy)",
        upstream="nothing: with PR A there is no _target_ to fill",
        remove_when=_REMOVE,
        signature="(config, task_runner_class) -> None",
    ),
)


def installed_verl_version() -> str:
    """verl's own version string (``verl/version/version``, what ``verl.__version__`` reads; verl is not imported)."""
    from stapo_verl.ledger import module_file

    if (init := module_file("verl")) is None:
        raise ModuleNotFoundError(f"verl is not installed; stapo-verl needs verl=={VERL_VERSION}")
    with open(os.path.join(os.path.dirname(init), "version", "version"), encoding="utf-8") as f:
        return f.read().strip()


def mismatches() -> list[str]:
    """Every difference between the installed verl and :data:`PATCHES`: the version first, then one line per symbol."""
    problems = []
    found = installed_verl_version()
    if found != VERL_VERSION:
        problems.append(f"verl {found} is installed; stapo-verl's integration is written for verl {VERL_VERSION}")
    return problems + ledger_mismatches(PATCHES, f"verl {VERL_VERSION}")


def allowed_anyway() -> bool:
    """True when ``STAPO_ALLOW_UNSUPPORTED_VERL=1``: load the whole integration on a verl it was not written for."""
    return os.environ.get(ALLOW_ENV, "") == "1"


def installed() -> bool:
    """Whether :func:`.installer.install` put the integration in place in this process (its first patch, the
    ``validate_config`` wrapper, carries the ``__stapo_integration__`` mark)."""
    import verl.utils.config as verl_config

    return bool(getattr(verl_config.validate_config, "__stapo_integration__", False))
