"""The CPU platform and its device-module wrapper (runs in a subprocess with VERL_PLATFORM=cpu, because verl
resolves its platform once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from stapo_verl.cpu.platform import CPU_DEVICE_MODULE, PlatformCPU

REQUIRED = ["empty_cache", "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "mem_get_info", "get_device_name", "get_rng_state", "set_rng_state", "set_per_process_memory_fraction",
            "ipc_collect", "reset_peak_memory_stats", "is_available", "synchronize", "current_device",
            "device_count", "set_device", "Stream", "Event", "current_stream", "stream"]


def test_device_module_members_exist_and_work():
    m = CPU_DEVICE_MODULE
    missing = [n for n in REQUIRED if not hasattr(m, n)]
    assert not missing, missing
    assert m.empty_cache() is None and m.ipc_collect() is None and m.reset_peak_memory_stats() is None
    assert m.memory_allocated() == 0 and m.max_memory_reserved() == 0
    free, total = m.mem_get_info()
    assert 0 < free <= total
    assert m.get_device_name() == "CPU" and m.is_available() is True
    state = m.get_rng_state()
    a = torch.rand(3)
    m.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)  # RNG restore (checkpoint resume path) really restores


def test_platform_members():
    p = PlatformCPU()
    assert (p.device_name, p.vendor_name, p.current_device()) == ("cpu", "cpu", "cpu")
    assert p.communication_backend_name() == "gloo" and p.ray_resource_name() == "GPU"
    assert p.device_module is CPU_DEVICE_MODULE and p.is_available() and p.device_count() == 1
    assert p.get_device_capability() == (None, None) and p.is_ipc_supported() is False
    with p.nvtx_range("x"):
        pass


def test_register_in_fresh_process():
    """With VERL_PLATFORM=cpu, `import verl` loads the plugin: platform, engine, both rollout registries, PG patch."""
    code = r"""
import json, verl
from verl.utils.device import get_device_name, get_torch_device, get_device_id
from verl.workers.engine.base import EngineRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, get_rollout_class
from verl.workers.rollout.replica import RolloutReplicaRegistry
import verl.utils.distributed as vd
import verl.workers.engine_workers as ew
import stapo_verl.cpu as c
c.register()  # idempotent
import verl.workers.engine.fsdp.transformer_impl as ti
print(json.dumps({
  "offload_pin_memory": ti.CPUOffloadPolicy().pin_memory,
  "device": get_device_name(), "device_id": get_device_id(), "module": get_torch_device().__name__,
  "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
  "adapter": get_rollout_class("cpu", "async").__name__,
  "replica": RolloutReplicaRegistry.get("cpu").__name__,
  "pg_patched": getattr(ew.initialize_global_process_group_ray, "_stapo_cpu_patched", False),
}))
"""
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    # the forward-only (ref) FSDP2 engine's CPUOffloadPolicy(pin_memory=True) cannot pin on CPU-only torch
    assert info == {"offload_pin_memory": False, "device": "cpu", "device_id": "cpu", "module": "stapo_verl.cpu.device_module",
                    "engine": "FSDPEngineWithLMHead", "adapter": "CPUServerAdapter", "replica": "CPUReplica",
                    "pg_patched": True}


def test_process_group_patch_initialises_gloo(tmp_path):
    """verl's initialize_global_process_group_ray works on CPU (would raise 'Duplicate device type cpu')."""
    code = r"""
import os, socket, verl, torch.distributed as dist
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
from verl.utils.distributed import initialize_global_process_group_ray
initialize_global_process_group_ray()
print(dist.get_backend())
dist.destroy_process_group()
"""
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "gloo"


def test_cpu_package_not_imported_without_cpu_platform():
    code = "import sys, verl, stapo_verl.plugin; print(any(m.startswith('stapo_verl.cpu') for m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
