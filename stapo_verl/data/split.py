"""Small row-selection helpers for preparation (``--max-rows``)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def take_rows(rows: Sequence[T], max_rows: int | None = None, seed: int | None = None) -> list[T]:
    """Keep at most ``max_rows`` rows: the first ones, or a seeded random sample in original order.

    Args:
        rows: prepared rows.
        max_rows: limit (``None`` = all). Must be ≥ 1.
        seed: ``None`` keeps the first ``max_rows`` rows (deterministic prefix); an int samples uniformly.

    Returns:
        A new list.

    Raises:
        ValueError: ``max_rows < 1``.
    """
    if max_rows is None or max_rows >= len(rows):
        return list(rows)
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    if seed is None:
        return list(rows[:max_rows])
    keep = sorted(random.Random(seed).sample(range(len(rows)), max_rows))
    return [rows[i] for i in keep]


def train_val_split(rows: Sequence[T], val_rows: int, seed: int = 0) -> tuple[list[T], list[T]]:
    """Split rows into a train part and a seeded random validation part of ``val_rows`` rows.

    Raises:
        ValueError: ``val_rows`` is negative or not smaller than ``len(rows)``.
    """
    if not 0 <= val_rows < len(rows):
        raise ValueError(f"val_rows must be in [0, {len(rows)}), got {val_rows}")
    val_idx = set(random.Random(seed).sample(range(len(rows)), val_rows))
    return [r for i, r in enumerate(rows) if i not in val_idx], [r for i, r in enumerate(rows) if i in val_idx]
