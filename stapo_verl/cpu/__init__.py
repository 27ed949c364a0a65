"""CPU backend for verl 0.9.1: platform, engine registration, HF-transformers rollout, tiny assets, and the
megatron-core/mbridge shims for verl's Megatron engine (:mod:`stapo_verl.cpu.megatron`, applied on import).

Loaded by :mod:`stapo_verl.plugin` only when ``VERL_PLATFORM=cpu``; :func:`register` runs in every process
(driver, TaskRunner, Ray workers) at ``import verl`` time, before verl's FSDP engine module is imported.
"""

from __future__ import annotations

import functools
import sys

ROLLOUT_NAME = "cpu"
ADAPTER_PATH = "stapo_verl.cpu.rollout_adapter.CPUServerAdapter"

_REGISTERED = False


def _patch_process_group_backend() -> None:
    """Make verl's Ray process-group init use plain ``gloo`` when no backend is passed.

    verl builds ``"cpu:gloo,{device}:{backend}"`` (``verl/utils/distributed.py:89``), i.e.
    ``"cpu:gloo,cpu:gloo"`` on this platform, which torch 2.13 rejects (``Duplicate device type cpu``).
    This is the backend's single monkeypatch. Patches the module attribute and, if already imported, the
    name bound in ``verl.workers.engine_workers`` (``from ... import`` at its line 38).
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
    """Register verl's FSDP/FSDP2 engines for device ``cpu`` (mirrors ``transformer_impl.py:1143, 1594``)."""
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


def _register_rollout() -> None:
    """Register the ``cpu`` rollout in both verl rollout registries.

    * ``verl/workers/rollout/base.py:89`` ``_ROLLOUT_REGISTRY[(name, "async")]`` → adapter class path
      (looked up in the trainer worker, ``engine_workers.py:667``);
    * ``verl/workers/rollout/replica.py:312`` ``RolloutReplicaRegistry`` → replica loader (TaskRunner).
    """
    from verl.workers.rollout.base import _ROLLOUT_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_PATH

    def _load_cpu_replica():
        from stapo_verl.cpu.rollout_replica import CPUReplica

        return CPUReplica

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_cpu_replica)


def _patch_fsdp2_offload_pin_memory() -> None:
    """Build verl's FSDP2 ``CPUOffloadPolicy`` with ``pin_memory=False`` (forward-only engines: ref model).

    ``verl/workers/engine/fsdp/transformer_impl.py:462`` constructs ``CPUOffloadPolicy(pin_memory=True)`` for
    every forward-only FSDP2 engine; pinning needs a CUDA build and fails on CPU-only torch. That line is the
    only construction site in the module, and ``verl.utils.fsdp_utils`` keeps the real class for its type
    checks, so only the module-level name is replaced. Idempotent.
    """
    import verl.workers.engine.fsdp.transformer_impl as ti

    if getattr(ti.CPUOffloadPolicy, "_stapo_cpu_patched", False):
        return
    orig = ti.CPUOffloadPolicy

    def cpu_offload_policy(pin_memory: bool = True, **kwargs):
        return orig(pin_memory=False, **kwargs)

    cpu_offload_policy._stapo_cpu_patched = True
    ti.CPUOffloadPolicy = cpu_offload_policy


def _install_megatron_hooks() -> None:
    """CPU shims for verl's Megatron engine (:mod:`stapo_verl.cpu.megatron`), applied by a post-import hook when
    verl imports ``verl.workers.engine.megatron`` / ``mbridge``; megatron-core is never imported from here."""
    from stapo_verl.cpu.megatron import install_hooks

    install_hooks()


def register() -> None:
    """Install the CPU backend in this process (idempotent).

    Order matters: the platform class is registered first, because importing
    ``verl.workers.engine.fsdp.transformer_impl`` freezes ``get_device_name()`` at import time.

    Raises:
        RuntimeError: if after registration verl's platform singleton is not :class:`PlatformCPU`
            (e.g. something resolved the platform before the plugin loaded).
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from verl.plugin.platform import PlatformRegistry

    from stapo_verl.cpu.platform import PlatformCPU

    PlatformRegistry.register(platform="cpu")(PlatformCPU)
    _patch_process_group_backend()
    _register_engines()
    _patch_fsdp2_offload_pin_memory()
    _register_rollout()
    _install_megatron_hooks()
    from verl.utils.device import get_device_name

    if get_device_name() != "cpu":
        raise RuntimeError(
            f"stapo_verl.cpu.register(): verl resolved device {get_device_name()!r}, expected 'cpu' "
            "(VERL_PLATFORM=cpu must be set before verl is imported in this process)"
        )
    _REGISTERED = True
