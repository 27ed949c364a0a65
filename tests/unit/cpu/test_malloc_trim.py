"""The rollout server's glibc ``malloc_trim`` lookup (stapo_verl.cpu.rollout_server.glibc_malloc_trim)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from stapo_verl.cpu.rollout_server import CPURolloutServer, glibc_malloc_trim

# In a fresh process with glibc's automatic trimming off (mallopt M_TRIM_THRESHOLD = 1 GiB), 40 MB of 100 kB heap
# chunks stay resident after they are freed; the function under test must hand them back.
PROBE = r"""
import ctypes, ctypes.util
from stapo_verl.cpu.rollout_server import glibc_malloc_trim
libc = ctypes.CDLL(ctypes.util.find_library("c"))
assert libc.mallopt(-1, 1 << 30) == 1  # M_TRIM_THRESHOLD
def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
blocks = [bytearray(100_000) for _ in range(400)]
held = anon_mib()
del blocks
freed = anon_mib()
glibc_malloc_trim()(0)
print(held, freed, anon_mib())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is a glibc function")
def test_trim_returns_freed_heap_memory_to_the_system():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    held, freed, trimmed = map(float, out.split())
    assert freed > held - 5, (held, freed)  # freeing alone keeps the pages (automatic trimming is off)
    assert trimmed < freed - 30, (held, freed, trimmed)  # the trim returns at least 30 of the 40 MB


def test_server_runs_every_batch_on_one_thread_with_the_trim():
    s = CPURolloutServer(config={}, model_config={"path": "unused"})
    assert s._generation_thread._max_workers == 1
    assert (s._malloc_trim is None) == (glibc_malloc_trim() is None)
