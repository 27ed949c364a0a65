"""``stapo_verl.launch.shm``: what counts as a run's orphan in ``/dev/shm`` (created since the run started, held by no
process) and that only those are removed. Real files in the real ``/dev/shm`` under a prefix of the test's own, held
by this process through an open descriptor or a mapping, checked against the real ``/proc``."""

from __future__ import annotations

import mmap
import os
import time
import uuid

import pytest

from stapo_verl.launch import shm

SHM = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="needs Linux's /dev/shm")


@pytest.fixture
def prefix():
    p = f"stapotest{uuid.uuid4().hex[:8]}_"
    yield p
    for name in os.listdir(SHM):
        if name.startswith(p):
            os.unlink(os.path.join(SHM, name))


def _make(prefix: str, name: str, size: int = 4096) -> str:
    path = os.path.join(SHM, prefix + name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_only_entries_created_since_the_start_and_held_by_no_process_are_removed(prefix):
    _make(prefix, "before")  # an earlier run's orphan: not this run's to remove
    time.sleep(1.3)  # inode change times one second (the function's slack) and more apart
    since = time.time()
    _make(prefix, "orphan_a")
    _make(prefix, "orphan_b")
    fd = os.open(_make(prefix, "open"), os.O_RDWR)  # held through a descriptor
    with open(_make(prefix, "mapped"), "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 4096)  # held through a mapping only, its descriptor closed
    try:
        assert shm.orphans(since, prefixes=(prefix,)) == [prefix + "orphan_a", prefix + "orphan_b"]
        t0 = time.monotonic()
        removed = shm.remove_orphans(since, settle_s=0.6, prefixes=(prefix,))
        waited = time.monotonic() - t0
        assert removed == [prefix + "orphan_a", prefix + "orphan_b"]
        assert sorted(n for n in os.listdir(SHM) if n.startswith(prefix)) == [
            prefix + "before", prefix + "mapped", prefix + "open"]
        assert waited >= 0.6  # it waited for the held ones to go, up to settle_s
    finally:
        os.close(fd)
        mapping.close()
    # released now: the same call removes them, and not the earlier run's entry
    assert shm.remove_orphans(since, settle_s=0, prefixes=(prefix,)) == [prefix + "mapped", prefix + "open"]
    assert [n for n in os.listdir(SHM) if n.startswith(prefix)] == [prefix + "before"]


def test_the_default_prefixes_are_multiprocessings_names():
    from multiprocessing import shared_memory, synchronize

    block = shared_memory.SharedMemory(create=True, size=64)
    try:
        assert block.name.startswith(shm.PREFIXES[0])
    finally:
        block.close()
        block.unlink()
    # glibc's sem_open("/mp-…") is the file /dev/shm/sem.mp-…
    assert "sem." + synchronize.SemLock._make_name().lstrip("/")[:3] == shm.PREFIXES[1]


def test_bad_settle_time_is_refused():
    with pytest.raises(ValueError, match="settle_s must be >= 0"):
        shm.remove_orphans(0.0, settle_s=-1)
