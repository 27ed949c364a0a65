"""Differential run of ``compute_score`` against the reference (:mod:`support.rewards_reference`).

:func:`build_items` turns every gold row of a dataset into test responses (:mod:`support.rewards_perturb`);
:func:`run` scores them in chunks in a pebble process pool (each chunk in-process, ``timeout_s=0``; a chunk that runs
past its limit is re-run item by item with a per-item limit, and an item past that limit counts as a timeout, which
the reward scores as wrong), and asks the reference about every response ``compute_score`` accepted.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter

from support.data_benchmarks import DATASETS, gold_rows
from support.rewards_perturb import Case, cases
from support.rewards_reference import reference_equivalent

#: data_source → tolerance name of the reference (the documented tolerance of the route).
TOLERANCE_OF = {"minerva": "relative_1e-4"}
#: Perturbed answers also tried in the other answer forms, per row (round robin over the row's perturbations).
FORMS_PER_ROW = 2


@dataclasses.dataclass(frozen=True)
class Item:
    """One scored response: dataset, data_source, row, :class:`~support.rewards_perturb.Case` and gold."""

    dataset: str
    data_source: str
    row: int
    kind: str
    answer: str
    response: str
    gold: str


def build_items(dataset: str, data_source: str | None = None) -> list[Item]:
    """Every test response for every gold row of ``dataset`` (scored with ``data_source``, default the dataset's).

    The perturbations of each row are all scored in the default box form; :data:`FORMS_PER_ROW` of them (chosen
    round robin by row) also in every other answer form, which bounds the count on DAPO-Math-17k's 17,917 rows.
    """
    _, default_source = DATASETS[dataset]
    source = data_source or default_source
    rows = gold_rows(dataset)
    golds = [g for _, _, g in rows]
    items: list[Item] = []
    for i, (row, _, gold) in enumerate(rows):
        other = next((o for o in golds[i + 1:] + golds[:i] if o.strip() != gold.strip()), gold + "1")
        all_cases = cases(gold, other, dapo_line=source.lower().startswith("math_dapo"))
        perturbed = sorted({c.kind.split("@")[0] for c in all_cases if "@" in c.kind})
        chosen = {perturbed[(i + k) % len(perturbed)] for k in range(FORMS_PER_ROW)} if perturbed else set()
        for case in all_cases:
            if "@" in case.kind and case.kind.split("@")[0] not in chosen:
                continue
            items.append(Item(dataset, source, row, case.kind, case.answer, case.response, gold))
    return items


def score_chunk(chunk: list[Item]) -> list[tuple[bool, bool | None]]:
    """``(compute_score acc, reference verdict or None when not accepted)`` for each item, in this process."""
    from stapo_verl.rewards import compute_score

    out = []
    for it in chunk:
        acc = bool(compute_score(it.data_source, it.response, it.gold, timeout_s=0)["acc"])
        ref = reference_equivalent(it.answer, it.gold, TOLERANCE_OF.get(it.data_source, "exact")) if acc else None
        out.append((acc, ref))
    return out


@dataclasses.dataclass
class Outcome:
    """Per item: accepted by ``compute_score``, the reference's verdict (None when not asked) and timed out."""

    item: Item
    acc: bool
    ref: bool | None
    timed_out: bool


def run(items: list[Item], workers: int | None = None, chunk_size: int = 50, chunk_timeout_s: float = 120.0,
        item_timeout_s: float = 10.0) -> tuple[list[Outcome], dict]:
    """Score ``items``; returns the outcomes (in order) and run statistics.

    Raises:
        RuntimeError: a chunk failed for another reason than its time limit.
    """
    from concurrent.futures import TimeoutError as FutureTimeout

    from pebble import ProcessPool

    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.perf_counter()
    chunks = [items[i:i + chunk_size] for i in range(0, len(items), chunk_size)]
    results: list[list[tuple[bool, bool | None, bool]] | None] = [None] * len(chunks)
    retried = 0
    with ProcessPool(max_workers=workers) as pool:
        futures = [pool.schedule(score_chunk, args=(c,), timeout=chunk_timeout_s) for c in chunks]
        for i, fut in enumerate(futures):
            try:
                results[i] = [(a, r, False) for a, r in fut.result()]
            except FutureTimeout:
                results[i] = None
        for i, res in enumerate(results):
            if res is not None:
                continue
            retried += 1
            single = [pool.schedule(score_chunk, args=([it],), timeout=item_timeout_s) for it in chunks[i]]
            res = []
            for fut in single:
                try:
                    (a, r), = fut.result()
                    res.append((a, r, False))
                except FutureTimeout:
                    res.append((False, None, True))
            results[i] = res
    outcomes = [Outcome(it, a, r, t) for chunk, res in zip(chunks, results) for it, (a, r, t) in zip(chunk, res)]
    stats = {"items": len(items), "chunks": len(chunks), "chunks_retried": retried,
             "timeouts": sum(o.timed_out for o in outcomes), "seconds": time.perf_counter() - t0}
    return outcomes, stats


def summarize(outcomes: list[Outcome]) -> dict:
    """Counts of one dataset: N, accepted, false positives (accepted, reference says wrong), and the agreement
    rates: ``gold``, ``first_digit`` rejected, ``variant`` and ``form`` accepted."""
    def rate(kind: str, want: bool) -> tuple[int, int]:
        sel = [o for o in outcomes if o.item.kind == kind]
        return sum(o.acc == want for o in sel), len(sel)

    false_pos = [o for o in outcomes if o.acc and o.ref is False]
    kinds = Counter(o.item.kind.split("@")[0] for o in outcomes)
    return {
        "N": len(outcomes),
        "rows": len({o.item.row for o in outcomes}),
        "accepted": sum(o.acc for o in outcomes),
        "false_positives": len(false_pos),
        "false_positive_examples": [(o.item.kind, o.item.answer, o.item.gold) for o in false_pos[:20]],
        "gold_correct": rate("gold", True),
        "first_digit_wrong": rate("first_digit", False),
        "variant_correct": rate("variant", True),
        "form_correct": rate("form", True),
        "timeouts": sum(o.timed_out for o in outcomes),
        "kinds": dict(kinds),
    }
