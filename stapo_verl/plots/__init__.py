"""Plots and reports of verl runs with the STAPO plugin (CPU tiny runs and GPU runs alike).

``python -m stapo_verl.plots report --run RUN_DIR`` and ``python -m stapo_verl.plots overlay --runs A B --out F``
(see :mod:`stapo_verl.plots.__main__`). Modules: :mod:`.loading` (metrics JSONL, token dump, validation dump),
:mod:`.curves` (entropy / validation accuracy / reward / masked fraction), :mod:`.scatter` (p–H scatter),
:mod:`.report` (a run's summary), :mod:`.overlay` (several runs).
"""
