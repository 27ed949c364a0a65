"""The rollout server's caps on oneDNN's kernel caches (stapo_verl.cpu.rollout_server.onednn_cache_env)."""

from __future__ import annotations

import os
import subprocess
import sys

from stapo_verl.cpu.rollout_server import ONEDNN_CACHE_CAPACITY, onednn_cache_env

CACHE_VARS = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")

# In a fresh process: bfloat16 matmuls of 300 different row counts, as generation produces; prints glibc's in-use
# heap in MiB after the first 100 shapes and after all 300.
PROBE = r"""
import ctypes, ctypes.util
import torch
torch.set_num_threads(1)
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
def in_use_mib():
    return libc.mallinfo2().uordblks / 2**20
w = torch.randn(64, 64, dtype=torch.bfloat16)
values = []
for rows in range(1, 301):
    torch.nn.functional.linear(torch.randn(rows, 64, dtype=torch.bfloat16), w)
    if rows in (100, 300):
        values.append(in_use_mib())
print(*values)
"""


def _growth_mib(extra_env: dict[str, str]) -> float:
    env = {**{k: v for k, v in os.environ.items() if k not in CACHE_VARS}, **extra_env}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env).stdout
    after_100, after_300 = map(float, out.split())
    return after_300 - after_100


def test_server_environment_keeps_bfloat16_matmul_kernels_bounded(monkeypatch):
    for k in CACHE_VARS:
        monkeypatch.delenv(k, raising=False)
    unbounded = _growth_mib({})
    bounded = _growth_mib(onednn_cache_env())  # the server actor's runtime_env (CPUReplica.launch_servers)
    # the server's caches hold 64 kernels each, full after the first 100 shapes: the next 200 add (almost) nothing.
    # How much the uncapped caches grow depends on the CPU's bfloat16 kernels (+7.5 MiB on an AVX-512 Xeon without
    # AMX, more with AMX); the capped growth stays under 2 MiB, or a fifth of the uncapped one, on every CPU.
    assert bounded < max(2.0, unbounded / 5), (bounded, unbounded)

def test_a_value_set_by_the_job_is_kept(monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    assert onednn_cache_env() == {"LRU_CACHE_CAPACITY": "7",
                                  "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ONEDNN_CACHE_CAPACITY)}
