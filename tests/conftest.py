"""Test-suite wiring: the kind markers (from the directory a test lives in) and the environment every test gets.

Kinds: ``tests/unit`` (in-process, seconds), ``tests/integration`` (verl engines and workers, gloo jobs, processes),
``tests/e2e`` (the real ``python -m verl.trainer.main_ppo``). Select with ``-m``, e.g.
``bash scripts/test.sh -m "not e2e"``.
"""

import os
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import pytest  # noqa: E402

KINDS = ("unit", "integration", "e2e")
_TESTS = Path(__file__).resolve().parent


#: The test files that run the real ``main_ppo`` or the launcher up to Ray, in two chains. ``scripts/test.sh`` runs two
#: pytest-xdist workers; each chain goes, whole and in this order, to one of them, and every other test file, whole, to
#: whichever worker is free. ``kill_and_orphans`` holds every test that kills a job's processes (SIGKILL, SIGTERM, a
#: dead worker) together with the tests that assert no ``/dev/shm`` entry of theirs is left held by no process: a job
#: killed beside such an assertion leaves entries that nothing removes for minutes. ``runs`` holds the runs that end
#: by themselves; the entries their Ray leaves at shutdown are removed by their launcher within seconds, which the
#: assertions wait for (``support.procs.no_shm_orphans_since``).
CHAINS = {
    "kill_and_orphans": ("e2e/test_tiny_stapo.py", "e2e/test_tiny_vllm.py", "e2e/test_tiny_worker_death.py",
                         "integration/launch/test_stop_signals.py", "integration/rewards/test_killable_runner.py"),
    "runs": ("e2e/test_tiny_stapo_megatron.py", "e2e/test_tiny_grpo.py", "e2e/test_tiny_two_nodes.py",
             "e2e/test_own_mask_from_docs.py", "integration/launch/test_ray_worker_register.py",
             "integration/launch/test_ray_start_retry.py"),
}


def scope_of(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: the name of the :data:`CHAINS` entry that holds the test's
    file, else the file itself (so a module-scoped fixture, a built model or a scored benchmark, is built once).

    ``nodeid`` is pytest's test id (``tests/unit/x.py::test_y[...]``)."""
    path = nodeid.split("::", 1)[0]
    rel = path[len("tests/"):] if path.startswith("tests/") else path
    return next((name for name, files in CHAINS.items() if rel in files), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduler with :func:`scope_of` as its unit of work and the :data:`CHAINS` handed out
    first (they are the longest units: started last, one would run alone at the end). xdist's ``--dist loadgroup``
    cannot do this under pytest 9.2, whose node ids no longer take the ``@group`` suffix it writes
    (https://github.com/pytest-dev/pytest-xdist/issues/1386): every test would go to either worker. Returns None
    (xdist's own scheduler) for ``--dist each``."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ChainScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            queue = self.workqueue  # xdist's OrderedDict of scopes, handed out from the front
            for name in reversed(list(CHAINS)):
                if name in queue:
                    queue.move_to_end(name, last=False)
            super()._assign_work_unit(node)

    return ChainScope(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark every test with its kind; a test outside the three kind directories is an error."""
    for item in items:
        rel = Path(str(item.path)).resolve().relative_to(_TESTS)
        kind = rel.parts[0]
        if kind not in KINDS:
            raise pytest.UsageError(f"{rel}: tests live under tests/{{{','.join(KINDS)}}}/")
        item.add_marker(getattr(pytest.mark, kind))
