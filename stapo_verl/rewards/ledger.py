"""The reward code's ledger: every standard-library, math-verify and pebble site :mod:`stapo_verl.rewards` patches or
relies on, each pinned by the fingerprint of the source it was written against.

Same form as the plugin's ledger (:data:`stapo_verl.integration.verl_0_9_1.PATCHES`) and the CPU platform's
(:mod:`stapo_verl.cpu.ledger`): :class:`~stapo_verl.ledger.Patch` entries with the symbol, what
is done to it, why, what would replace it upstream, when to remove it, and the symbol's signature (plus the sha256 of
its source where the code relies on a body), read with ``ast`` from the installed source
(:mod:`stapo_verl.ledger`; the standard library's and math-verify's are plain Python files).
An entry whose ``action`` starts with "relied on" is a contract the code depends on without changing it; every other
entry is a site the code changes, and ``tests/unit/rewards/test_ledger.py`` finds those sites in the reward code (and
in :mod:`stapo_verl.launch` and :mod:`stapo_verl.eval`) and asserts that this ledger lists exactly them.

Python versions. The standard-library fingerprints were read from CPython 3.11.7 (the version of the main
environment); when they were written, every one of them was identical in CPython 3.10.13, 3.11.2, 3.12.1 (the GPU
image's minor version) and 3.13.0, so the gate passes there. The one body that changes between patch releases
(``ResourceTracker.__init__``: 3.11.2 and 3.11.7 differ) is pinned by its signature only, and the code reads the
attribute it relies on with a default. On a Python where a pinned body differs, nobody has read the new body: the
gate refuses, as the CPU platform's gate does for a megatron-core it was not written for.

When the entries are checked (:func:`check`, raising :class:`IncompatibleRewardSiteError` naming the first symbol that
differs): the multiprocessing and pebble entries (:data:`POOL_PATCHES`) by
:meth:`stapo_verl.rewards.timeout.KillableRunner._start_pool`, before it starts the pool whose fork server, workers and
exit hook apply them (a failure inside the fork server would be swallowed by its preload, one at exit cannot be
reported); the math-verify entries (:data:`MATH_VERIFY_PATCHES`) by :mod:`stapo_verl.rewards.equivalence` before it sets
math-verify's flags, once per process. ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` (the one override of every ledger's gate)
turns the error into a warning. This module imports neither verl nor torch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from stapo_verl.ledger import ALLOW_ENV, Patch
from stapo_verl.ledger_gate import enforce_ledger

logger = logging.getLogger(__name__)

STDLIB_WRITTEN_FOR = "the CPython 3.11.7 standard library (identical in 3.10.13, 3.11.2, 3.12.1 and 3.13.0)"
PEBBLE_WRITTEN_FOR = "pebble 5.2.3"
POOL_WRITTEN_FOR = f"{STDLIB_WRITTEN_FOR} and {PEBBLE_WRITTEN_FOR}"
MATH_VERIFY_WRITTEN_FOR = "math-verify 0.9.0"

_POOL_REMOVE = "when the reward workers no longer come from multiprocessing's fork server"
_MAIN_UPSTREAM = ("CPython: a documented way to start forkserver children without re-running the parent's __main__ "
                  "(per process or per Process object)")


class IncompatibleRewardSiteError(BaseException):
    """A site of the reward code's ledger differs from the source it was written against.

    A ``BaseException``, as the other ledgers' errors: the reward function runs inside verl's reward loop, and an
    ``except Exception`` on its way must not turn a refused environment into a score.
    """


STDLIB_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="multiprocessing.spawn.prepare",
        action="replaced in the reward workers' fork server (stapo_verl.rewards.worker.keep_main_module_out_of_workers,"
        " run by the fork server's preload of stapo_verl.rewards.warm): for pebble's workers it drops the "
        "init_main_from_name / init_main_from_path keys, then calls the original",
        why="the original re-runs the trainer's __main__ in every worker (a script without a main guard runs again; "
        "verl.trainer.main_ppo imports torch, about 5 s per worker). The replacement relies on these two keys being "
        "the only main-module step of the body, hence the hash",
        upstream=_MAIN_UPSTREAM,
        remove_when="when CPython can start forkserver children without the parent's main module",
        signature="(data)",
        source_sha256="2d5a133d4f0a98a85b7d3b3548f26a6a4c9de0bbe8d1ef5976d4fb51c91da3f7",
    ),
    Patch(
        symbol="multiprocessing.spawn._main",
        action="relied on (not patched): the child side of the fork server calls prepare by its module-level name",
        why="the replacement above reaches the workers only through that name, hence the hash",
        upstream=_MAIN_UPSTREAM,
        remove_when="with the multiprocessing.spawn.prepare entry",
        signature="(fd, parent_sentinel)",
        source_sha256="bbe174e8b9fe7793479e823986436c04e29353c35d56407292e6a4ca27e8d8be",
    ),
    Patch(
        symbol="multiprocessing.spawn.get_preparation_data",
        action="relied on (not patched): puts the process name under 'name' and the main module under "
        "init_main_from_name / init_main_from_path",
        why="the replacement of prepare tells pebble's workers by data['name'] and drops those two keys, hence the "
        "hash",
        upstream=_MAIN_UPSTREAM,
        remove_when="with the multiprocessing.spawn.prepare entry",
        signature="(name)",
        source_sha256="bcff9c55f054a2dd0041cef4f9a57a638478a04310b005aafa80c38658dfe59c",
    ),
    Patch(
        symbol="multiprocessing.forkserver.ForkServer.__init__",
        action="state of the module's instance (multiprocessing.forkserver._forkserver) changed in each reward worker: "
        "_forkserver_alive_fd closed and set to None (stapo_verl.rewards.worker._release_fork_server); read in the "
        "trainer: _forkserver_pid, SIGKILLed when the workers do not start (stapo_verl.rewards.timeout."
        "_kill_fork_server)",
        why="every child of the fork server inherits the write end of the pipe on which the server waits for EOF to "
        "exit; a hung worker holding it would keep the server, and itself, alive after a SIGKILLed trainer. The "
        "body declares both attributes, hence the hash (both are read with a default)",
        upstream="CPython: forkserver children that do not inherit the alive pipe (or an option to close it)",
        remove_when=_POOL_REMOVE,
        signature="(self)",
        source_sha256="dea50076ca423bd0ee400997df07e38822c09ee23537c7caea3c07b9ed5e2088",
    ),
    Patch(
        symbol="multiprocessing.forkserver._forkserver",
        action="relied on (not patched): the module's one ForkServer, whose attributes the entry above names",
        why="the code reaches the fork server's state through this name",
        upstream="as the ForkServer.__init__ entry",
        remove_when="with the ForkServer.__init__ entry",
        signature="_forkserver = ForkServer(…)",
        source_sha256="1b59647398855d85fc9f2db679b1a5aaee40221051eecd3a1a3c4720f2d49b8a",
    ),
    Patch(
        symbol="multiprocessing.forkserver._serve_one",
        action="relied on (not patched): stores the inherited alive-pipe fd in _forkserver._forkserver_alive_fd "
        "before it runs the child",
        why="the worker closes the fd it finds there; a body that kept it elsewhere would leave it open, hence the "
        "hash",
        upstream="as the ForkServer.__init__ entry",
        remove_when="with the ForkServer.__init__ entry",
        signature="(child_r, fds, unused_fds, handlers)",
        source_sha256="4cd0f6c8fe1725ee149fc7d7d80ae507e39419072293c81b70f32c88bb09d791",
    ),
    Patch(
        symbol="multiprocessing.resource_tracker.unregister",
        action="rebound to a no-op at exit of the process that owns the pool, only when its resource tracker was "
        "killed (stapo_verl.rewards.timeout._no_unregister_after_tracker_death, an atexit hook)",
        why="Ray kills a worker's children, the tracker among them; the pool's semaphore finalizers would then start "
        "a new tracker and send it names it never registered (KeyError tracebacks on the job's console). The "
        "semaphores are unlinked before the call either way",
        upstream="CPython: a relaunched resource tracker could ignore an unknown name on UNREGISTER",
        remove_when="when CPython's resource tracker ignores names it does not know",
        signature="unregister = …",
        source_sha256="03c2b342963e671838b526b148fb0e7d0a7cae591d7411b3f6991eef5dadbbdf",
    ),
    Patch(
        symbol="multiprocessing.synchronize.SemLock._cleanup",
        action="relied on (not patched): unlinks the semaphore, then calls resource_tracker.unregister, looked up "
        "at the call",
        why="the rebinding above reaches the finalizers only because the name is looked up at each call, and is "
        "harmless only because the unlink comes first, hence the hash",
        upstream="as the resource_tracker.unregister entry",
        remove_when="with the resource_tracker.unregister entry",
        signature="(name)",
        source_sha256="d5ea326c147ddb6183ec3c5d172c153742e91cb3976784d1a42fcc7378c810bb",
    ),
    Patch(
        symbol="multiprocessing.resource_tracker.ResourceTracker.__init__",
        action="relied on (read): _pid of the module's instance (_resource_tracker), the tracker's process id "
        "(stapo_verl.rewards.timeout._tracker_died)",
        why="the exit hook tells whether the tracker died by its pid. No hash: the body changes between patch "
        "releases (3.11.2 and 3.11.7 differ) without touching _pid, which is read with a default (a missing one "
        "makes the hook a no-op)",
        upstream="as the resource_tracker.unregister entry",
        remove_when="with the resource_tracker.unregister entry",
        signature="(self)",
    ),
)

PEBBLE_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="pebble.pool.process.WorkerManager.new_worker",
        action="relied on (not patched): starts every worker as a process named pebble.pool.process.WORKERS_NAME",
        why="the replacement of multiprocessing.spawn.prepare tells pebble's workers by that name. No hash (pebble is "
        "not pinned to one release): a worker named otherwise is prepared as usual, slower to start, never wrong",
        upstream=_MAIN_UPSTREAM,
        remove_when="with the multiprocessing.spawn.prepare entry",
        signature="(self)",
    ),
)

MATH_VERIFY_PATCHES: tuple[Patch, ...] = (
    Patch(
        symbol="math_verify.parser.TIMEOUT_WARNING_SHOWN",
        action="set to True before the first parse of each process (stapo_verl.rewards.equivalence._math_verify)",
        why="the scorers call parse with parsing_timeout=None (math-verify's own timeout uses signal.alarm, which "
        "does not work in verl's reward threads; the killable workers bound each call instead), and parse then "
        "logs a 'Timeout is disabled' warning unless this module global is set",
        upstream="math-verify: a way to say the caller bounds the call itself (e.g. a parameter that silences it)",
        remove_when="when math-verify stops warning for a caller-bounded call, or the scorers use its timeout",
        signature="TIMEOUT_WARNING_SHOWN = False",
    ),
    Patch(
        symbol="math_verify.grader.TIMEOUT_WARNING_SHOWN",
        action="set to True before the first verify of each process (stapo_verl.rewards.equivalence._math_verify)",
        why="as for parse: verify is called with timeout_seconds=None",
        upstream="as the math_verify.parser.TIMEOUT_WARNING_SHOWN entry",
        remove_when="as the math_verify.parser.TIMEOUT_WARNING_SHOWN entry",
        signature="TIMEOUT_WARNING_SHOWN = False",
    ),
    Patch(
        symbol="math_verify.parser.parse",
        action="relied on (not patched): reads the module global TIMEOUT_WARNING_SHOWN before it warns",
        why="the flag above silences the warning only through this read, hence the hash",
        upstream="as the math_verify.parser.TIMEOUT_WARNING_SHOWN entry",
        remove_when="with the math_verify.parser.TIMEOUT_WARNING_SHOWN entry",
        signature="(pred: str, extraction_config: Sequence[ExtractionTarget]=[LatexExtractionConfig(), "
        "ExprExtractionConfig()], fallback_mode: Literal['no_fallback', 'first_match']='first_match', "
        "extraction_mode: Literal['first_match', 'any_match']='any_match', parsing_timeout: int=5, "
        "raise_on_error: bool=False)",
        source_sha256="bc66b8c4fe2cc878ddbc4aaf70e95bee4cc93f802be91398679c4a550412064a",
    ),
    Patch(
        symbol="math_verify.grader.verify",
        action="relied on (not patched): reads the module global TIMEOUT_WARNING_SHOWN before it warns",
        why="as for parse",
        upstream="as the math_verify.parser.TIMEOUT_WARNING_SHOWN entry",
        remove_when="with the math_verify.grader.TIMEOUT_WARNING_SHOWN entry",
        signature="(gold: list[Basic | MatrixBase | str] | Basic | MatrixBase | str, target: list[Basic | MatrixBase "
        "| str] | Basic | MatrixBase | str, float_rounding: int=6, numeric_precision: int=15, strict: bool=True, "
        "allow_set_relation_comp: bool=False, timeout_seconds: int | None=5, raise_on_error: bool=False) -> bool",
        source_sha256="a1490a178d1b64556c566ff1faf70e58403326ab02becfe294df367897846ae0",
    ),
)

#: what KillableRunner checks before it starts a pool
POOL_PATCHES: tuple[Patch, ...] = STDLIB_PATCHES + PEBBLE_PATCHES
#: the whole ledger
PATCHES: tuple[Patch, ...] = POOL_PATCHES + MATH_VERIFY_PATCHES


def check(patches: Iterable[Patch], written_for: str) -> None:
    """Raise unless every entry's symbol exists with the signature (and source hash) it was written for.

    Args:
        patches: ledger entries, e.g. :data:`POOL_PATCHES`.
        written_for: what they were written against, for the message (e.g. :data:`POOL_WRITTEN_FOR`).

    Raises:
        IncompatibleRewardSiteError: a symbol is missing or differs (the message names the first one and the count),
            unless ``STAPO_ALLOW_UNSUPPORTED_VERL=1`` (then a warning, on ``warnings`` and the log, listing every
            difference).
    """
    enforce_ledger(patches, written_for, owner="reward code (stapo_verl.rewards)", error=IncompatibleRewardSiteError,
                   log=logger, remedy="Install the versions it was written for (math-verify==0.9.0; Python 3.10 to "
                   f"3.13). To score anyway, at your own risk: {ALLOW_ENV}=1.")
