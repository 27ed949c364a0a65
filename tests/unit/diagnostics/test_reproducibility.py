"""Which metrics two runs of one command must reproduce (``stapo_verl.diagnostics.reproducibility``): time, speed
and memory are left out, the seconds of ``current_minibatch``'s extra forward included; every other key stays."""

from stapo_verl.diagnostics.reproducibility import reproducible


def test_time_keys_are_left_out_and_the_rest_kept():
    metrics = {1: {"timing_s/step": 14.3, "perf/throughput": 80.0, "actor/perf/max_memory_allocated_gb": 1.0,
                   "actor/stapo/current_forward_s": 0.24, "actor/stapo/mask_disagreement": 1.0,
                   "actor/pg_clipfrac": 0.012, "actor/entropy": 0.19},
               0: {"val-core/math_dapo/acc/mean@4": 0.69}}
    assert reproducible(metrics) == {1: {"actor/stapo/mask_disagreement": 1.0, "actor/pg_clipfrac": 0.012,
                                         "actor/entropy": 0.19},
                                     0: {"val-core/math_dapo/acc/mean@4": 0.69}}
