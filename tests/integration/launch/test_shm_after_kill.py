"""What Ray does to a job's processes, done to one: a process that created a ``multiprocessing`` shared-memory block
and a named semaphore is SIGKILLed together with its process group (its resource tracker included, as Ray kills a
worker's children). Its ``/dev/shm`` entries stay behind, held by no process; :func:`stapo_verl.launch.shm.
remove_orphans` (what the launcher runs after ``ray.shutdown()``) removes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from support.procs import child_env

from stapo_verl.launch import shm

CHILD = r'''
import multiprocessing as mp, sys, time
from multiprocessing import shared_memory
block = shared_memory.SharedMemory(create=True, size=1 << 20)
lock = mp.get_context("forkserver").Lock()   # a named semaphore, as pebble's pool locks under forkserver
print(block.name, "sem." + lock._semlock.name.lstrip("/"), flush=True)
time.sleep(120)
'''


@pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="needs Linux's /dev/shm")
def test_entries_of_a_killed_process_group_are_removed_after_it_ends():
    since = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=child_env(),
                            start_new_session=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 2 and names[0].startswith("psm_") and names[1].startswith("sem.mp-"), names
        assert all(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
        assert not set(names) & set(shm.orphans(since))  # held while the process lives
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30  # the group's other processes (the resource tracker) go with it
    while set(names) - set(shm.orphans(since)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(names) <= set(shm.orphans(since)), "the killed group's entries should be left, held by no process"
    removed = shm.remove_orphans(since, settle_s=0)
    assert set(names) <= set(removed)
    assert not any(os.path.exists(os.path.join(shm.SHM_DIR, n)) for n in names)
