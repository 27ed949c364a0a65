"""CPU backend for verl 0.9.1: platform, engine registration, HF-transformers rollout, tiny assets, and the
megatron-core/mbridge shims for verl's Megatron engine (:mod:`stapo_verl.cpu.megatron_shims`, applied on import).

Loaded by :mod:`stapo_verl.plugin` only when ``VERL_PLATFORM=cpu``; :func:`register` runs in every process
(driver, TaskRunner, Ray workers) at ``import verl`` time, before verl's FSDP engine module is imported. It checks
the CPU platform's ledger (:mod:`stapo_verl.cpu.ledger`: every verl, megatron-core, mbridge and torch site this
package patches or relies on, each with the fingerprint of the source it was written against), registers the
platform at once and everything else with post-import hooks (:func:`stapo_verl.integration.post_import.
when_imported`), when verl itself imports the module concerned: a process that never builds an engine or a rollout
(the driver, the reward and agent-loop workers) does not import verl's engine stack (megatron-core, peft, ...) for
the plugin's sake, which on 2 cores saved seconds per process at start-up. The megatron-core and mbridge entries are
checked when their shims are installed (those packages are optional and only verl's Megatron engine imports them).
"""

from __future__ import annotations

import functools
import sys

ROLLOUT_NAME = "cpu"
ADAPTER_PATH = "stapo_verl.cpu.rollout_adapter.CPUServerAdapter"
#: seconds between the v1 replay buffer's checks for finished rollouts on this platform (verl's default: 2.0)
REPLAY_POLL_INTERVAL_S = 0.1


def _patch_process_group_backend(_module) -> None:
    """Make verl's Ray process-group init use plain ``gloo`` when no backend is passed (idempotent).

    ``verl.utils.distributed.initialize_global_process_group_ray`` builds ``"cpu:gloo,{device}:{backend}"``, i.e.
    ``"cpu:gloo,cpu:gloo"`` on this platform, which torch 2.13 rejects (``Duplicate device type cpu``). Patches the
    module attribute and, if already imported, the name ``verl.workers.engine_workers`` binds with
    ``from ... import`` (imported later, it binds the patched function).

    Args:
        _module: ``verl.utils.distributed`` (the post-import hook's argument; imported by name below).
    """
    import verl.utils.distributed as vd

    orig = vd.initialize_global_process_group_ray
    if getattr(orig, "_stapo_cpu_patched", False):
        return

    @functools.wraps(orig)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return orig(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._stapo_cpu_patched = True
    vd.initialize_global_process_group_ray = initialize_global_process_group_ray
    ew = sys.modules.get("verl.workers.engine_workers")
    # engine_workers may be partially initialised here (the hook fires while it imports verl.utils.distributed)
    if ew is not None and getattr(ew, "initialize_global_process_group_ray", None) is orig:
        ew.initialize_global_process_group_ray = initialize_global_process_group_ray


def _register_engines() -> None:
    """Register verl's FSDP/FSDP2 engines for device ``cpu`` in ``verl.workers.engine.base.EngineRegistry`` (as
    ``verl.workers.engine.fsdp.transformer_impl`` registers them for ``cuda`` / ``npu``)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        existing = EngineRegistry._engines.get(model_type, {})
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
    forward-only FSDP2 engine (``FSDPEngine._build_fsdp_module``); pinning needs a CUDA build and fails on CPU-only
    torch. That is the only construction site in the module, and ``verl.utils.fsdp_utils`` keeps the real class
    for its type checks, so only the module-level name is replaced. Idempotent.
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
    ``trainer.v1.sampler.poll_interval`` key passed by ``_build_replay_buffer``. Idempotent. The signature it was
    written for (``poll_interval: float = 2.0``) is pinned in the ledger (:mod:`stapo_verl.cpu.ledger`).

    Args:
        module: ``verl.trainer.ppo.v1.replay_buffer`` (the post-import hook's argument).
    """
    orig = module.ReplayBuffer.__init__
    if getattr(orig, "_stapo_cpu_patched", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, poll_interval: float = REPLAY_POLL_INTERVAL_S, **kwargs):
        orig(self, *args, poll_interval=poll_interval, **kwargs)

    __init__._stapo_cpu_patched = True
    module.ReplayBuffer.__init__ = __init__


def _on_fsdp_engine(_module) -> None:
    _register_engines()
    _patch_fsdp2_offload_pin_memory()


def register() -> None:
    """Install the CPU backend in this process (idempotent).

    Checks the ledger's verl entries (:data:`stapo_verl.cpu.ledger.VERL_PATCHES`), then registers the platform class
    at once (importing ``verl.workers.engine.fsdp.transformer_impl`` freezes ``get_device_name()``); the
    process-group patch, the engine and rollout registrations, the FSDP2 offload policy, the replay buffer's poll
    interval and, for verl's vLLM rollout, vLLM's CPU linear layers and verl's batch-invariance switch
    (:mod:`stapo_verl.cpu.vllm_cpu`) follow through post-import hooks on the modules they touch (run at once where
    already imported).
    Whether the backend is installed is read from verl's platform registry (``cpu`` → :class:`PlatformCPU`).

    Raises:
        stapo_verl.cpu.ledger.IncompatibleSiteError: a site of the ledger differs from what it was written for
            (the message names the symbol), unless ``STAPO_ALLOW_UNSUPPORTED_VERL=1``.
        RuntimeError: if after registration verl's platform singleton is not :class:`PlatformCPU`
            (e.g. something resolved the platform before the plugin loaded).
    """
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from stapo_verl.cpu.platform import PlatformCPU

    if PlatformRegistry.get(ROLLOUT_NAME) is not PlatformCPU:
        from stapo_verl.cpu import ledger
        from stapo_verl.cpu.megatron_shims import install_hooks
        from stapo_verl.integration.post_import import when_imported

        ledger.check(ledger.VERL_PATCHES, ledger.VERL_WRITTEN_FOR)
        PlatformRegistry.register(platform=ROLLOUT_NAME)(PlatformCPU)
        when_imported("verl.utils.distributed", _patch_process_group_backend)
        when_imported("verl.workers.engine.fsdp.transformer_impl", _on_fsdp_engine)
        when_imported("verl.workers.rollout.base", lambda _module: _register_rollout_adapter())
        when_imported("verl.workers.rollout.replica", lambda _module: _register_rollout_replica())
        when_imported("verl.trainer.ppo.v1.replay_buffer", _patch_replay_buffer_poll_interval)
        # verl's vLLM rollout (rollout.name=vllm): only the engine's worker process imports this module
        when_imported("vllm.model_executor.layers.utils", "stapo_verl.cpu.vllm_cpu:patch_cpu_unquantized_gemm")
        when_imported("verl.workers.rollout.vllm_rollout.vllm_async_server",
                      "stapo_verl.cpu.vllm_cpu:patch_vllm_http_server_init")
        install_hooks()
    from verl.utils.device import get_device_name

    if get_device_name() != "cpu":
        raise RuntimeError(
            f"stapo_verl.cpu.register(): verl resolved device {get_device_name()!r}, expected 'cpu' "
            "(VERL_PLATFORM=cpu must be set before verl is imported in this process)"
        )
