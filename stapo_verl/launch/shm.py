"""Named shared-memory objects that a job's killed processes leave in ``/dev/shm``: found and removed once Ray is down.

Why. Python's :mod:`multiprocessing` gives its POSIX objects names in ``/dev/shm`` and unlinks them when the
creating process exits, or, for a process that was killed, from that process's resource tracker
(:mod:`multiprocessing.resource_tracker`):

* ``sem.mp-*``: named semaphores (``multiprocessing.synchronize.SemLock`` under the ``spawn`` and ``forkserver``
  start methods), e.g. the locks of the reward function's pebble pool (:mod:`stapo_verl.rewards.timeout`);
* ``psm_*``: :class:`multiprocessing.shared_memory.SharedMemory` blocks, e.g. vLLM's message queues
  (``vllm.distributed.device_communicators.shm_broadcast.ShmRingBuffer``) under ``rollout.name=vllm``.

Ray ends a job's worker processes with SIGKILL and kills their child processes too (the resource tracker among
them), so nothing unlinks what they created: on the project's machines every tiny run left two or three
``sem.mp-*`` entries and each ``ROLLOUT=vllm`` run two ``psm_*`` blocks (about 400 MB of ``/dev/shm``), held by no
process. The launcher (:mod:`stapo_verl.launch.train`) therefore removes, after ``ray.shutdown()``, the entries with
those prefixes that were created since the run started and that no process has open or mapped any more. An entry a
process still holds (another job's, or one of this job's processes still dying) is never touched.

Upstream: this belongs to Ray's worker teardown (a resource tracker that outlives the worker it serves) or to verl's
``main_ppo`` shutdown; neither has it in Ray 2.x / verl 0.9.1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

#: where Linux keeps POSIX named semaphores and shared-memory objects
SHM_DIR = "/dev/shm"
#: the name prefixes of Python multiprocessing's named objects: shared_memory blocks, named semaphores
PREFIXES = ("psm_", "sem.mp-")


def _held(names: set[str], shm_dir: str, proc_dir: str) -> set[str]:
    """The subset of ``names`` (entries of ``shm_dir``) that some process has mapped (``/proc/<pid>/maps``) or open
    (``/proc/<pid>/fd``). Matched by device and inode, not by path: glibc's ``sem_open`` creates a semaphore under a
    temporary name, maps it and links it to its name, so the mapping shows the temporary (deleted) path. Processes
    that end while being read, or whose files are not readable, are skipped."""
    by_inode: dict[tuple[str, int], str] = {}
    for name in names:
        try:
            st = os.stat(os.path.join(shm_dir, name))
        except OSError:
            continue
        by_inode[(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino)] = name
    if not by_inode:
        return set()
    devices = {dev for dev, _ in by_inode}
    held: set[str] = set()
    for pid in os.listdir(proc_dir):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc_dir, pid, "maps"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    if len(fields) >= 5 and fields[3] in devices:
                        name = by_inode.get((fields[3], int(fields[4])))
                        if name is not None:
                            held.add(name)
            fd_dir = os.path.join(proc_dir, pid, "fd")
            for fd in os.listdir(fd_dir):
                try:
                    st = os.stat(os.path.join(fd_dir, fd))
                except OSError:
                    continue
                name = by_inode.get((f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino))
                if name is not None:
                    held.add(name)
        except (OSError, ValueError):
            continue
    return held


def _recent(since: float, shm_dir: str, prefixes: tuple[str, ...]) -> set[str]:
    """Names in ``shm_dir`` with one of ``prefixes`` whose inode changed (was created) at or after ``since``."""
    try:
        entries = os.listdir(shm_dir)
    except OSError:
        return set()
    recent = set()
    for name in entries:
        if not name.startswith(prefixes):
            continue
        try:
            if os.stat(os.path.join(shm_dir, name)).st_ctime >= since - 1.0:  # whole-second clocks on some kernels
                recent.add(name)
        except OSError:  # unlinked meanwhile
            continue
    return recent


def orphans(since: float, *, shm_dir: str = SHM_DIR, proc_dir: str = "/proc",
            prefixes: Iterable[str] = PREFIXES) -> list[str]:
    """Names in ``shm_dir`` with one of ``prefixes``, created (inode change time) at or after ``since`` (seconds
    since the epoch), that no process holds; sorted. Raises nothing (a missing ``shm_dir`` gives ``[]``)."""
    recent = _recent(since, shm_dir, tuple(prefixes))
    return sorted(recent - _held(recent, shm_dir, proc_dir))


def remove_orphans(since: float, *, settle_s: float = 5.0, shm_dir: str = SHM_DIR, proc_dir: str = "/proc",
                   prefixes: Iterable[str] = PREFIXES) -> list[str]:
    """Unlink :func:`orphans` of the run that started at ``since``; returns the names removed, sorted.

    Processes Ray killed may still be exiting when ``ray.shutdown()`` returns: while an entry created since ``since``
    is still held, it looks again every 0.25 s for at most ``settle_s`` seconds, then leaves what is still held.

    Raises:
        ValueError: ``settle_s < 0``.
    """
    if settle_s < 0:
        raise ValueError(f"settle_s must be >= 0, got {settle_s!r}")
    prefixes = tuple(prefixes)
    removed: list[str] = []
    deadline = time.monotonic() + settle_s
    while True:
        recent = _recent(since, shm_dir, prefixes)
        held = _held(recent, shm_dir, proc_dir)
        for name in sorted(recent - held):
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:
                pass
        if not held or time.monotonic() >= deadline:
            return sorted(removed)
        time.sleep(0.25)
