"""The CPU platform's device-module wrapper and platform class, in process (registration into verl:
tests/integration/cpu/test_platform_register.py)."""

from __future__ import annotations

import torch

from stapo_verl.cpu.platform import PlatformCPU, build_cpu_device_module

REQUIRED = ["empty_cache", "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
            "mem_get_info", "get_device_name", "get_rng_state", "set_rng_state", "set_per_process_memory_fraction",
            "ipc_collect", "reset_peak_memory_stats", "is_available", "synchronize", "current_device",
            "device_count", "set_device", "Stream", "Event", "current_stream", "stream"]


def test_device_module_members_exist_and_work():
    m = build_cpu_device_module()
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
    assert p.device_module.__name__ == "stapo_verl.cpu.device_module" and p.is_available() and p.device_count() == 1
    assert p.device_module is p.device_module  # built once per platform object (verl keeps one per process)
    assert PlatformCPU().device_module is not p.device_module  # and owned by it: no module-level instance
    assert p.get_device_capability() == (None, None) and p.is_ipc_supported() is False
    with p.nvtx_range("x"):
        pass


def test_replay_buffer_poll_interval_default():
    """The CPU platform's replay-buffer patch: a new default, an explicit value still wins; idempotent. Patched on a
    subclass, so verl's own class in this process is untouched. (The constructor it was written for,
    ``poll_interval: float = 2.0``, is pinned by the ledger: tests/unit/cpu/test_ledger.py.)"""
    import types

    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    from stapo_verl.cpu import REPLAY_POLL_INTERVAL_S, _patch_replay_buffer_poll_interval

    class Patched(ReplayBuffer):
        pass

    _patch_replay_buffer_poll_interval(types.SimpleNamespace(ReplayBuffer=Patched))
    _patch_replay_buffer_poll_interval(types.SimpleNamespace(ReplayBuffer=Patched))  # idempotent
    args = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
                sampler_kwargs={})
    assert REPLAY_POLL_INTERVAL_S == 0.1
    assert Patched(**args).poll_interval == 0.1
    assert Patched(**args, poll_interval=3.0).poll_interval == 3.0
    assert Patched.__init__ is not ReplayBuffer.__init__  # the test leaves verl's own class alone
