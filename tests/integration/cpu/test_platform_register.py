"""Registration of the CPU platform into verl, in fresh processes with VERL_PLATFORM=cpu (verl resolves its platform
once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


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
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
rb = ReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                  max_off_policy_strategy="drop", sampler_kwargs={})
print(json.dumps({
  "replay_poll_interval": rb.poll_interval,
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
    # the v1 replay buffer checks for finished rollouts every 0.1 s instead of verl's 2 s
    assert info == {"replay_poll_interval": 0.1, "offload_pin_memory": False, "device": "cpu", "device_id": "cpu", "module": "stapo_verl.cpu.device_module",
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


def test_registration_waits_until_verl_imports_its_engine_stack():
    """With VERL_PLATFORM=cpu, ``import verl`` (which loads the plugin) registers the platform only; a process that
    never builds an engine (driver, reward and agent-loop workers) does not import the engines or megatron-core."""
    code = ("import json, sys, verl; from verl.utils.device import get_device_name; print(json.dumps({"
            "'device': get_device_name(), 'engines': 'verl.workers.engine' in sys.modules, "
            "'megatron': any(m.split('.')[0] in ('megatron', 'mbridge') for m in sys.modules)}))")
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"device": "cpu", "engines": False, "megatron": False}
