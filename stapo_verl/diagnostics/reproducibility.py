"""Which of a run's metrics two runs of one command must reproduce exactly: every key but time, speed and memory.

A seeded run of the tiny recipe is reproducible on one CPU type (every random draw depends only on the seed and what
it is for); verl's timing and throughput metrics measure the machine, not the run.
"""

from __future__ import annotations

#: metrics that measure time, speed or memory (they differ between two runs of one command); every other key must not
NON_REPRODUCIBLE = ("timing_s/", "timing_per_token_ms/", "perf/mfu/", "perf/throughput", "perf/time_per_step",
                    "actor/perf/", "actor/stapo/current_forward_s")


def reproducible(metrics: dict[int, dict]) -> dict[int, dict]:
    """``{step: {key: value}}`` without the keys that start with one of :data:`NON_REPRODUCIBLE`. Raises nothing."""
    return {step: {k: v for k, v in data.items() if not k.startswith(NON_REPRODUCIBLE)}
            for step, data in metrics.items()}
