"""What Ray does to a job's processes, done to one: a process that created a ``multiprocessing`` shared-memory block
and a named semaphore is SIGKILLed together with its process group (its resource tracker included, as Ray kills a
worker's children). Its ``/dev/shm`` entries stay behind, held by no process; :func:`stapo_verl.launch.shm.
remove_orphans` (what the launcher runs after ``ray.shutdown()``) removes them.

The entries carry a prefix of the test's own (multiprocessing's objects, named: ``SharedMemory(name=...)`` and a
``SemLock`` with a name), so a launcher ending beside the test, which removes only multiprocessing's default names
(``shm.PREFIXES``, checked in tests/unit/launch/test_shm.py), never takes them first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from support.procs import child_env

from stapo_verl.launch import shm

CHILD = r'''
import sys, time
from multiprocessing import shared_memory
from _multiprocessing import SemLock
prefix = sys.argv[1]
block = shared_memory.SharedMemory(name=prefix + "psm", create=True, size=1 << 20)
lock = SemLock(1, 1, 1, "/" + prefix + "sem", False)  # a named semaphore (kind 1: SEMAPHORE), as pebble's pool locks
print(block.name, "sem." + prefix + "sem", flush=True)
time.sleep(120)
'''


@pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="needs Linux's /dev/shm")
def test_entries_of_a_killed_process_group_are_removed_after_it_ends():
    prefix = f"stapotest{uuid.uuid4().hex[:8]}_"
    own = (prefix, "sem." + prefix)
    since = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, prefix], stdout=subprocess.PIPE, text=True, env=child_env(),
                            start_new_session=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 2 and names == [prefix + "psm", f"sem.{prefix}sem"], names
        assert all(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
        assert not set(names) & set(shm.orphans(since, prefixes=own))  # held while the process lives
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30  # the group's other processes (the resource tracker) go with it
    while set(names) - set(shm.orphans(since, prefixes=own)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = set(shm.orphans(since, prefixes=own))
    assert set(names) <= left, "the killed group's entries should be left, held by no process"
    removed = shm.remove_orphans(since, settle_s=0, prefixes=own)
    assert set(names) <= set(removed)
    assert not any(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
