"""Registration of the CPU platform into verl, in fresh processes with VERL_PLATFORM=cpu (verl resolves its platform
once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _python_on_cpu_platform(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process with ``VERL_PLATFORM=cpu``; fails the test on a non-zero exit."""
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_AUTH_MODE="disabled")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r

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
    r = _python_on_cpu_platform(code)
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
    r = _python_on_cpu_platform(code)
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
    r = _python_on_cpu_platform(code)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"device": "cpu", "engines": False, "megatron": False}


def test_register_refuses_a_site_that_differs_naming_it():
    """The CPU platform's ledger is checked when ``import verl`` registers the platform: a site that differs from
    what the ledger pins (here: the replay buffer's constructor with another poll_interval default) stops the
    process with IncompatibleSiteError naming the symbol, before anything is patched."""
    code = r"""
import dataclasses
import stapo_verl.cpu.ledger as L
entry = next(e for e in L.VERL_PATCHES if e.symbol.endswith("ReplayBuffer.__init__"))
L.VERL_PATCHES = L.VERL_PATCHES + (dataclasses.replace(
    entry, signature=entry.signature.replace("poll_interval: float=2.0", "poll_interval: float=1.0")),)
import verl
print("IMPORTED")
"""
    env = dict(os.environ, VERL_PLATFORM="cpu", RAY_AUTH_MODE="disabled")
    env.pop("STAPO_ALLOW_UNSUPPORTED_VERL", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "IMPORTED" not in r.stdout, r.stdout + r.stderr[-3000:]
    assert "IncompatibleSiteError" in r.stderr, r.stderr[-3000:]
    assert ("verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.__init__: signature" in r.stderr
            and "poll_interval: float=1.0" in r.stderr), r.stderr[-3000:]


def test_megatron_shims_install_after_their_ledger_check():
    """When verl imports its Megatron engine (and mbridge), the shims install: each proxied megatron-core module gets
    its own torch stand-in, the CUDA type names exist only inside the scoped functions, the engines are registered
    for 'cpu', mbridge's names are rebound; installing again changes nothing."""
    code = r"""
import json, verl, torch
import verl.workers.engine.megatron  # the post-import hook: ledger check, then the shims
import mbridge  # the mbridge hook
from megatron.core.optimizer import clip_grads, optimizer
from mbridge.core import bridge as mb_bridge, util as mb_util
from stapo_verl.cpu.megatron_shims import core, bridge
from stapo_verl.cpu.megatron_shims.torch_proxy import TorchOnCPU, install_into
from verl.workers.engine.base import EngineRegistry
import importlib
mods = [importlib.import_module(m) for m in core.PROXIED_MODULES]
proxies = [m.torch for m in mods]
core.install(); bridge.install()  # idempotent
with core._cuda_type_names_ctx():
    inside = torch.ones(2).type()
print(json.dumps({
  "proxied": all(isinstance(p, TorchOnCPU) for p in proxies),
  "one_per_module": len({id(p) for p in proxies}) == len(proxies),
  "kept": [m.torch for m in mods] == proxies and install_into(mods[0]) is False,
  "current_device": str(mods[0].torch.cuda.current_device()),
  "inside": inside, "outside": torch.ones(2).type(),
  "clip_scoped": optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32
                 and getattr(clip_grads.clip_grad_by_total_norm_fp32, "_stapo_cpu", False),
  "engine": EngineRegistry._engines["language_model"]["megatron"]["cpu"].__name__,
  "mbridge": mb_bridge.get_model is mb_util.get_model and isinstance(mb_util.torch, TorchOnCPU),
}))
"""
    r = _python_on_cpu_platform(code, timeout=600)
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info == {"proxied": True, "one_per_module": True, "kept": True, "current_device": "cpu",
                    "inside": "torch.cuda.FloatTensor", "outside": "torch.FloatTensor", "clip_scoped": True,
                    "engine": "MegatronEngineWithLMHead", "mbridge": True}


def test_process_group_patch_when_engine_workers_imports_distributed_first():
    """In a Ray worker, ``verl.utils.distributed`` is first imported by ``verl.workers.engine_workers`` itself: the
    hook then runs while engine_workers is partly initialised (its name not bound yet), and engine_workers binds the
    patched function afterwards."""
    code = ("import sys, verl; first = 'verl.utils.distributed' not in sys.modules; "
            "import verl.workers.engine_workers as ew; "
            "print(first, getattr(ew.initialize_global_process_group_ray, '_stapo_cpu_patched', False))")
    r = _python_on_cpu_platform(code)
    assert r.stdout.strip().splitlines()[-1].split()[-1] == "True"
