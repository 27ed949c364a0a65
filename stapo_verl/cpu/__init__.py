"""CPU backend for verl 0.9.1: platform, engine registration, HF-transformers rollout, tiny assets, and the
megatron-core/mbridge shims for verl's Megatron engine (:mod:`stapo_verl.cpu.megatron_shims`, applied on import).

Loaded by :mod:`stapo_verl.plugin` only when ``VERL_PLATFORM=cpu``; :func:`register` runs in every process
(driver, TaskRunner, Ray workers) at ``import verl`` time, before verl's FSDP engine module is imported. It registers
the platform at once and everything else with post-import hooks (:func:`stapo_verl.integration.post_import.
when_imported`), when verl itself imports the module concerned: a process that never builds an engine or a rollout
(the driver, the reward and agent-loop workers) does not import verl's engine stack (megatron-core, peft, ...) for
the plugin's sake, which on 2 cores saved seconds per process at start-up.
"""

from __future__ import annotations

import functools
import sys

ROLLOUT_NAME = "cpu"
ADAPTER_PATH = "stapo_verl.cpu.rollout_adapter.CPUServerAdapter"
#: seconds between the v1 replay buffer's checks for finished rollouts on this platform (verl's default: 2.0)
REPLAY_POLL_INTERVAL_S = 0.1

_REGISTERED = False


def _patch_process_group_backend() -> None:
    """Make verl's Ray process-group init use plain ``gloo`` when no backend is passed.

    ``verl.utils.distributed.initialize_global_process_group_ray`` builds ``"cpu:gloo,{device}:{backend}"``, i.e.
    ``"cpu:gloo,cpu:gloo"`` on this platform, which torch 2.13 rejects (``Duplicate device type cpu``).
    This is the backend's single monkeypatch. Patches the module attribute and, if already imported, the
    name ``verl.workers.engine_workers`` binds with ``from ... import``.
    """
    import verl.utils.distributed as vd

    for fn_name in ("initialize_global_process_group_ray",):
        orig = getattr(vd, fn_name)
        if getattr(orig, "_stapo_cpu_patched", False):
            continue

        @functools.wraps(orig)
        def wrapper(timeout_second=None, backend=None, _orig=orig):
            return _orig(timeout_second=timeout_second, backend=backend or "gloo")

        wrapper._stapo_cpu_patched = True
        setattr(vd, fn_name, wrapper)
        ew = sys.modules.get("verl.workers.engine_workers")
        if ew is not None and getattr(ew, fn_name, None) is orig:
            setattr(ew, fn_name, wrapper)


def _register_engines() -> None:
    """Register verl's FSDP/FSDP2 engines for device ``cpu`` in ``verl.workers.engine.base.EngineRegistry`` (as
    ``verl.workers.engine.fsdp.transformer_impl`` registers them for ``cuda`` / ``npu``)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        existing = EngineRegistry._engines.get(model_type, {})
        if all(existing.get(b, {}).get("cpu") is cls for b in ("fsdp", "fsdp2")):
            continue
        # register() asserts on duplicate keys, so only add missing ones.
        missing = [b for b in ("fsdp", "fsdp2") if "cpu" not in existing.get(b, {})]
        if missing:
            EngineRegistry.register(model_type=model_type, backend=missing, device="cpu")(cls)


def _register_rollout_adapter() -> None:
    """``verl.workers.rollout.base._ROLLOUT_REGISTRY[("cpu", "async")]`` → the adapter class path (looked up by the
    trainer worker, ``verl.workers.engine_workers``)."""
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY

    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


def _load_cpu_replica():
    from stapo_verl.cpu.rollout_replica import CPUReplica

    return CPUReplica


def _register_rollout_replica() -> None:
    """``verl.workers.rollout.replica.RolloutReplicaRegistry["cpu"]`` → the replica loader (TaskRunner)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_cpu_replica)


def _patch_fsdp2_offload_pin_memory() -> None:
    """Build verl's FSDP2 ``CPUOffloadPolicy`` with ``pin_memory=False`` (forward-only engines: ref model).

    ``verl.workers.engine.fsdp.transformer_impl`` constructs ``CPUOffloadPolicy(pin_memory=True)`` for every
    forward-only FSDP2 engine; pinning needs a CUDA build and fails on CPU-only torch. That is the only
    construction site in the module, and ``verl.utils.fsdp_utils`` keeps the real class for its type checks, so
    only the module-level name is replaced. Idempotent.
    """
    import verl.workers.engine.fsdp.transformer_impl as ti

    if getattr(ti.CPUOffloadPolicy, "_stapo_cpu_patched", False):
        return
    orig = ti.CPUOffloadPolicy

    def cpu_offload_policy(pin_memory: bool = True, **kwargs):
        return orig(pin_memory=False, **kwargs)

    cpu_offload_policy._stapo_cpu_patched = True
    ti.CPUOffloadPolicy = cpu_offload_policy


def _patch_replay_buffer_poll_interval(module) -> None:
    """Make verl's v1 ``ReplayBuffer`` check for finished rollouts every :data:`REPLAY_POLL_INTERVAL_S` seconds.

    ``verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.sample`` sleeps ``poll_interval`` (2.0 s, not exposed in the
    trainer config; ``PPOTrainer._build_replay_buffer`` does not pass it) between checks, so every generation and
    validation phase takes a multiple of 2 s: on a GPU cluster's minute-long rollouts that is noise, on the tiny CPU
    run (a rollout of 128 short answers takes 2–3 s) it rounded ``timing_s/gen`` up to 4.0 s on every step. Only the
    constructor's default changes; an explicit ``poll_interval`` still wins. Upstream replacement: a
    ``trainer.v1.sampler.poll_interval`` key passed by ``_build_replay_buffer``. Idempotent.

    Raises:
        RuntimeError: ``ReplayBuffer.__init__`` has no ``poll_interval`` parameter with verl 0.9.1's default 2.0
            (another verl: the patch would silently do nothing or the wrong thing).
    """
    import inspect

    cls = module.ReplayBuffer
    orig = cls.__init__
    if getattr(orig, "_stapo_cpu_patched", False):
        return
    param = inspect.signature(orig).parameters.get("poll_interval")
    if param is None or param.default != 2.0:
        raise RuntimeError(
            "stapo_verl.cpu: verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__ has "
            f"{'no poll_interval parameter' if param is None else f'poll_interval={param.default!r}'}; the CPU "
            "platform was written for verl 0.9.1's poll_interval: float = 2.0"
        )

    @functools.wraps(orig)
    def __init__(self, *args, poll_interval: float = REPLAY_POLL_INTERVAL_S, **kwargs):
        orig(self, *args, poll_interval=poll_interval, **kwargs)

    __init__._stapo_cpu_patched = True
    cls.__init__ = __init__


def _install_megatron_hooks() -> None:
    """CPU shims for verl's Megatron engine (:mod:`stapo_verl.cpu.megatron_shims`), applied by a post-import hook when
    verl imports ``verl.workers.engine.megatron`` / ``mbridge``; megatron-core is never imported from here."""
    from stapo_verl.cpu.megatron_shims import install_hooks

    install_hooks()


#: verl module → what this backend installs right after verl imports it (each idempotent)
_HOOKS = (
    ("verl.utils.distributed", lambda _m: _patch_process_group_backend()),
    ("verl.workers.engine.fsdp.transformer_impl", lambda _m: (_register_engines(), _patch_fsdp2_offload_pin_memory())),
    ("verl.workers.rollout.base", lambda _m: _register_rollout_adapter()),
    ("verl.workers.rollout.replica", lambda _m: _register_rollout_replica()),
    ("verl.trainer.ppo.v1.replay_buffer", _patch_replay_buffer_poll_interval),
)


def register() -> None:
    """Install the CPU backend in this process (idempotent).

    The platform class is registered at once (importing ``verl.workers.engine.fsdp.transformer_impl`` freezes
    ``get_device_name()``); the process-group patch, the engine and rollout registrations and the FSDP2 offload
    policy follow through post-import hooks on the verl modules they touch (run at once where already imported).

    Raises:
        RuntimeError: if after registration verl's platform singleton is not :class:`PlatformCPU`
            (e.g. something resolved the platform before the plugin loaded).
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from verl.plugin.platform import PlatformRegistry

    from stapo_verl.cpu.platform import PlatformCPU
    from stapo_verl.integration.post_import import when_imported

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    for module, hook in _HOOKS:
        when_imported(module, hook)
    _install_megatron_hooks()
    from verl.utils.device import get_device_name

    if get_device_name() != "cpu":
        raise RuntimeError(
            f"stapo_verl.cpu.register(): verl resolved device {get_device_name()!r}, expected 'cpu' "
            "(VERL_PLATFORM=cpu must be set before verl is imported in this process)"
        )
    _REGISTERED = True
