"""CPU platform for verl 0.9.1 and the device-module wrapper it returns.

Mirrors ``verl/plugin/platform/platform_cuda.py`` (the reference implementation of ``PlatformBase``,
``verl/plugin/platform/platform_base.py``). ``torch.cpu`` itself cannot be the device module: it lacks
``empty_cache``, the memory counters, ``get_rng_state``/``set_rng_state`` and ``get_device_name``, which
verl calls on every step and on resume (see docs/cpu_backend.md).
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Optional

import torch
from verl.plugin.platform.platform_base import PlatformBase


def _zero(*_args, **_kwargs) -> int:
    return 0


def _noop(*_args, **_kwargs) -> None:
    return None


def _mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
    """(free, total) host memory in bytes, like ``torch.cuda.mem_get_info``."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except Exception:  # psutil is a verl dependency, but keep metrics best-effort
        return 0, 0


def _set_rng_state(state: torch.Tensor, *_args, **_kwargs) -> None:
    torch.set_rng_state(state)


def _get_rng_state(*_args, **_kwargs) -> torch.Tensor:
    return torch.get_rng_state()


def build_cpu_device_module() -> types.ModuleType:
    """Return a module object usable wherever verl expects ``torch.cuda``.

    Re-exports every public member of ``torch.cpu`` (``is_available``, ``synchronize``, ``current_device``,
    ``device_count``, ``set_device``, ``Stream``, ``Event``, ``current_stream``, ``stream``) and adds the
    members ``torch.cpu`` lacks: ``empty_cache``/``ipc_collect``/``reset_peak_memory_stats``/
    ``set_per_process_memory_fraction`` (no-ops), ``memory_allocated``/``memory_reserved``/
    ``max_memory_allocated``/``max_memory_reserved`` (0), ``mem_get_info`` (host RAM via psutil),
    ``get_device_name`` ("CPU"), ``get_rng_state``/``set_rng_state`` (torch's CPU generator).

    Returns:
        types.ModuleType named ``stapo_verl.cpu.device_module``.
    """
    mod = types.ModuleType("stapo_verl.cpu.device_module")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(mod, name, getattr(torch.cpu, name))
    for name in ("empty_cache", "ipc_collect", "reset_peak_memory_stats", "set_per_process_memory_fraction",
                 "reset_max_memory_allocated", "manual_seed", "manual_seed_all"):
        setattr(mod, name, _noop)
    mod.manual_seed = lambda seed: torch.manual_seed(seed)
    mod.manual_seed_all = lambda seed: torch.manual_seed(seed)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(mod, name, _zero)
    mod.mem_get_info = _mem_get_info
    mod.get_device_name = lambda *a, **k: "CPU"
    mod.get_rng_state = _get_rng_state
    mod.set_rng_state = _set_rng_state
    mod.is_available = lambda: True
    return mod


class PlatformCPU(PlatformBase):
    """verl platform ``cpu``: device ``cpu``, vendor ``cpu``, collective backend ``gloo``.

    Selected with ``VERL_PLATFORM=cpu`` (or auto-detected when CUDA is unavailable). Keeps
    ``ray_resource_name() == "GPU"`` because verl's resource pools always request the accelerator resource
    (``verl.single_controller.ray.base.RayResourcePool``); the run declares virtual GPUs to Ray instead.
    ``current_device()`` returns the string ``"cpu"``: an int would mean "accelerator 0" to torch.
    """

    @property
    def device_name(self) -> str:
        """"cpu": used by verl for meshes, autocast, engine lookup and the process-group string."""
        return "cpu"

    @property
    def vendor_name(self) -> str:
        """"cpu": second half of the engine-registry key (device, vendor)."""
        return "cpu"

    @functools.cached_property
    def device_module(self) -> types.ModuleType:
        """The torch.cpu wrapper with the CUDA-style members verl calls (memory stats, RNG state, empty_cache):
        :func:`build_cpu_device_module`, built once per platform object (verl keeps one per process,
        ``verl.plugin.platform.get_platform``)."""
        return build_cpu_device_module()

    def is_available(self) -> bool:
        """Always True: the CPU is there."""
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """Auto-detection: chosen only where CUDA is absent."""
        return not torch.cuda.is_available()

    def current_device(self) -> str:  # type: ignore[override]
        """The string "cpu" (an int would mean "accelerator 0" to torch and fail)."""
        return "cpu"

    def device_count(self) -> int:
        """One logical device per process."""
        return 1

    def set_device(self, device_index: int) -> None:
        """No-op: there is one CPU device."""
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        """No-op: CPU ops are synchronous."""
        return None

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed torch's CPU generator (there is one device)."""
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """No-op: no caching allocator on CPU."""
        return None

    def empty_cache(self) -> None:
        """No-op: no caching allocator on CPU."""
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        """(None, None): no compute capability; verl reads it as 0."""
        return (None, None)

    def communication_backend_name(self) -> str:
        """"gloo", the CPU collective backend."""
        return "gloo"

    def visible_devices_envvar(self) -> str:
        """CUDA_VISIBLE_DEVICES: Ray sets it for virtual GPUs; CPU torch ignores it."""
        return "CUDA_VISIBLE_DEVICES"

    def nvtx_range(self, msg: str):
        """A null context: no NVTX on CPU."""
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        """No-op: no device profiler."""
        return None

    def profiler_stop(self) -> None:
        """No-op: no device profiler."""
        return None

    def ray_resource_name(self) -> str:
        """"GPU": verl's pools always request the accelerator resource; runs declare virtual GPUs."""
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        """None: only vLLM/SGLang servers read these."""
        return []

    def is_ipc_supported(self) -> bool:
        """False: no CUDA IPC handles on CPU."""
        return False

    def cudart(self) -> Any:
        """None: no CUDA runtime."""
        return None
