"""Imported by the reward workers' fork server only (``set_forkserver_preload``), before it forks any worker.

1. Warms the scorers up once (:func:`stapo_verl.rewards.worker.warm_up`: math-verify, sympy, one parse; never
   raises), so every worker forked from the server starts ready to score.
2. Keeps the caller's main module out of the workers. For every child, multiprocessing re-runs the parent's
   ``__main__`` (``multiprocessing.spawn.prepare``: ``init_main_from_path`` / ``init_main_from_name``), which executes
   the top level of a script without a main guard in each worker, and imports ``verl.trainer.main_ppo`` (torch,
   about 5 s) into each worker when that is the main module. The reward workers run only functions of
   ``stapo_verl`` and pebble, so for pebble's workers (process name ``pebble.pool.process.WORKERS_NAME``) this server
   drops those two keys before ``prepare`` runs; any other process forked from the server is prepared as usual.
"""

import multiprocessing.spawn

from pebble.pool.process import WORKERS_NAME

from stapo_verl.rewards.worker import warm_up

_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
_prepare = multiprocessing.spawn.prepare


def _prepare_worker(data: dict) -> None:
    """``multiprocessing.spawn.prepare`` without the main-module step for pebble's workers."""
    if data.get("name") == WORKERS_NAME:
        data = {k: v for k, v in data.items() if k not in _MAIN_KEYS}
    _prepare(data)


multiprocessing.spawn.prepare = _prepare_worker
warm_up()
