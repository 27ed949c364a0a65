"""Score many responses in parallel through :func:`stapo_verl.rewards.compute_score` (timeouts included)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from stapo_verl.rewards import RewardFunction


def score_many(
    items: Sequence[tuple[str, str, str]], timeout_s: float | None = None, threads: int | None = None
) -> list[dict]:
    """Score ``(data_source, response, ground_truth)`` triples, in order.

    Threads only dispatch; the scoring runs in the killable worker processes of a
    :class:`stapo_verl.rewards.RewardFunction` of this call (at most ``runner.max_workers`` at a time), stopped
    when it returns.

    Args:
        items: triples to score.
        timeout_s: per-sample hard timeout (default: the runner's).
        threads: dispatch threads (default: the runner's ``max_workers``).

    Returns:
        One :func:`compute_score` dict per item.
    """
    kwargs = {} if timeout_s is None else {"timeout_s": timeout_s}
    with RewardFunction() as compute_score:
        threads = threads or compute_score.runner.max_workers or os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=threads) as pool:
            return list(pool.map(lambda it: compute_score(it[0], it[1], it[2], **kwargs), items))
