"""What STAPO silences, shown where verl users already look: verl's trackers (``trainer.logger``).

* :mod:`.stats` — mask statistics of one optimizer mini-batch (candidate-entropy quantiles, the share of
  positive-advantage tokens below τ_p, p and H histograms of the low-probability tokens split by advantage sign,
  the silenced tokens' position in the response), global over the data-parallel group; torch only.
* :mod:`.shipping` — what travels from the actor worker to the driver inside the worker's train output (the
  histograms and the silenced-token rows), and when a table is due (``policy_loss.dump_every``).
* :mod:`.trackers` — writes the rows and histograms to every configured backend of verl's ``Tracking`` that can
  hold them (wandb table / histogram, TensorBoard text / histogram, MLflow table artifact, SwanLab and ClearML
  tables, console and ``file`` top-k lines).
* :mod:`.collapse` — running z-scores of ``actor/entropy`` and of the LM-head / total gradient norm, and the
  one-line console warning.
* :mod:`.quadrants` — the paper's probability × entropy quadrants of positive-advantage tokens with the exact
  logit-gradient norm (offline analysis: ``benchmarks/bench_spurious_quadrants.py``).
* :mod:`.paired` — Student-t confidence intervals of paired multi-seed differences
  (``benchmarks/paired_comparison.py``).

User documentation: ``docs/diagnostics.md``.
"""
