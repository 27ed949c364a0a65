"""The rollout server's glibc ``malloc_trim`` lookup (stapo_verl.cpu.rollout_server.glibc_malloc_trim)."""

from __future__ import annotations

import platform

import pytest

from stapo_verl.cpu.rollout_server import CPURolloutServer, glibc_malloc_trim


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is a glibc function")
def test_found_on_glibc_and_returns_whether_memory_was_released():
    trim = glibc_malloc_trim()
    assert trim is not None
    blocks = [bytearray(100_000) for _ in range(200)]  # 20 MB of heap chunks (below the 128 KiB mmap threshold)
    del blocks
    assert trim(0) in (0, 1)  # 1: memory was released, 0: none could be


def test_server_runs_every_batch_on_one_thread_with_the_trim():
    s = CPURolloutServer(config={}, model_config={"path": "unused"})
    assert s._generation_thread._max_workers == 1
    assert (s._malloc_trim is None) == (glibc_malloc_trim() is None)
