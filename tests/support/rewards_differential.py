"""Differential run of ``compute_score`` against the reference (:mod:`support.rewards_reference`).

:func:`build_items` turns every gold row of a dataset into test responses (:mod:`support.rewards_perturb`);
:func:`run` scores them in chunks in a pebble process pool (each chunk in-process, ``timeout_s=0``, each item under a
SIGALRM limit; an item past it counts as a timeout, which
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


class ItemTimeout(BaseException):
    """Raised by SIGALRM in a worker (a BaseException: math-verify's ``except Exception`` must not swallow it)."""


def _alarm(signum, frame):
    raise ItemTimeout()


def score_chunk(chunk: list[Item], item_timeout_s: float) -> list[tuple[bool, bool | None, bool]]:
    """``(acc, reference verdict or None when not accepted, timed out)`` per item, in this (worker) process.

    Each item gets ``item_timeout_s`` (SIGALRM; a timed-out item is not accepted, as the reward scores a timeout
    wrong); the reference of an accepted item gets the same budget again, and a reference that times out counts
    as "not confirmed" (``ref=None`` with ``acc=True``), which the test reports.
    """
    import signal

    from stapo_verl.rewards import compute_score

    signal.signal(signal.SIGALRM, _alarm)
    out = []
    for it in chunk:
        try:
            signal.setitimer(signal.ITIMER_REAL, item_timeout_s)
            acc = bool(compute_score(it.data_source, it.response, it.gold, timeout_s=0)["acc"])
        except ItemTimeout:
            out.append((False, None, True))
            continue
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        ref = None
        if acc:
            try:
                signal.setitimer(signal.ITIMER_REAL, item_timeout_s)
                ref = reference_equivalent(it.answer, it.gold, TOLERANCE_OF.get(it.data_source, "exact"))
            except ItemTimeout:
                ref = None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        out.append((acc, ref, False))
    return out


@dataclasses.dataclass
class Outcome:
    """Per item: accepted by ``compute_score``, the reference's verdict (None when not asked) and timed out."""

    item: Item
    acc: bool
    ref: bool | None
    timed_out: bool


def run(items: list[Item], workers: int | None = None, chunk_size: int = 200, item_timeout_s: float = 5.0,
        chunk_timeout_s: float = 600.0) -> tuple[list[Outcome], dict]:
    """Score ``items`` in a pebble process pool; returns the outcomes (in order) and run statistics.

    A chunk that runs past ``chunk_timeout_s`` (an item stuck inside a C call, where SIGALRM cannot interrupt it)
    is killed by pebble and re-run item by item, each with pebble's timeout ``item_timeout_s``.
    """
    from concurrent.futures import TimeoutError as FutureTimeout

    from pebble import ProcessPool

    workers = workers or min(2, os.cpu_count() or 1)
    t0 = time.perf_counter()
    chunks = [items[i:i + chunk_size] for i in range(0, len(items), chunk_size)]
    results: list[list | None] = [None] * len(chunks)
    retried = 0
    with ProcessPool(max_workers=workers) as pool:
        futures = [pool.schedule(score_chunk, args=(c, item_timeout_s), timeout=chunk_timeout_s) for c in chunks]
        for i, fut in enumerate(futures):
            try:
                results[i] = fut.result()
            except FutureTimeout:
                retried += 1
        for i, res in enumerate(results):
            if res is not None:
                continue
            single = [pool.schedule(score_chunk, args=([it], item_timeout_s), timeout=item_timeout_s + 30)
                      for it in chunks[i]]
            res = []
            for fut in single:
                try:
                    res.extend(fut.result())
                except FutureTimeout:
                    res.append((False, None, True))
            results[i] = res
    outcomes = [Outcome(it, a, r, t) for chunk, res in zip(chunks, results) for it, (a, r, t) in zip(chunk, res)]
    stats = {"items": len(items), "chunks": len(chunks), "chunks_retried": retried,
             "timeouts": sum(o.timed_out for o in outcomes), "seconds": round(time.perf_counter() - t0, 1)}
    return outcomes, stats


def summarize(outcomes: list[Outcome]) -> dict:
    """Counts of one dataset: N, accepted, false positives (accepted, reference says wrong), and the agreement
    rates: ``gold``, ``first_digit`` rejected, ``variant`` and ``form`` accepted."""
    def rate(kind: str, want: bool) -> tuple[int, int]:
        sel = [o for o in outcomes if o.item.kind == kind]
        return sum(o.acc == want for o in sel), len(sel)

    false_pos = [o for o in outcomes if o.acc and o.ref is False]
    unconfirmed = [o for o in outcomes if o.acc and o.ref is None]
    kinds = Counter(o.item.kind.split("@")[0] for o in outcomes)
    return {
        "N": len(outcomes),
        "rows": len({o.item.row for o in outcomes}),
        "accepted": sum(o.acc for o in outcomes),
        "false_positives": len(false_pos),
        "false_positive_examples": [(o.item.kind, o.item.answer, o.item.gold) for o in false_pos[:20]],
        "unconfirmed": len(unconfirmed),
        "unconfirmed_examples": [(o.item.kind, o.item.answer, o.item.gold) for o in unconfirmed[:10]],
        "gold_correct": rate("gold", True),
        "first_digit_wrong": rate("first_digit", False),
        "variant_correct": rate("variant", True),
        "form_correct": rate("form", True),
        "timeouts": sum(o.timed_out for o in outcomes),
        "kinds": dict(kinds),
    }
