"""Imported by the reward workers' fork server only (``set_forkserver_preload``), before it forks any worker.

1. Keeps the caller's main module out of the workers
   (:func:`stapo_verl.rewards.worker.keep_main_module_out_of_workers`: multiprocessing would re-run the trainer's
   ``__main__`` in every worker).
2. Warms the scorers up once (:func:`stapo_verl.rewards.worker.warm_up`: math-verify, sympy, one parse), so every
   worker forked from the server starts ready to score. A failure raises
   :class:`~stapo_verl.rewards.worker.ScorersUnavailable` (an ``ImportError``: the fork server ignores it), so this
   module is imported in a process exactly when the process is warm; the workers check that before every call.
"""

from stapo_verl.rewards.worker import keep_main_module_out_of_workers, warm_up

keep_main_module_out_of_workers()
warm_up()
