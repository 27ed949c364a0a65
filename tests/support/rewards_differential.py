"""Differential run of ``compute_score`` against the reference (:mod:`support.rewards_reference`).

:func:`build_items` turns every gold row of a dataset into test responses (:mod:`support.rewards_perturb`);
:func:`run` scores them in chunks in a pebble process pool (each chunk in-process, ``timeout_s=0``, each item under a
CPU-time limit; an item past it counts as a timeout, which
the reward scores as wrong), and asks the reference about every response ``compute_score`` accepted.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections import Counter

from support.data_benchmarks import DATASETS, gold_rows
from support.rewards_perturb import cases
from support.rewards_reference import reference_equivalent as _reference

reference_equivalent = functools.lru_cache(maxsize=8192)(_reference)

#: data_source → tolerance name of the reference (the documented tolerance of the route).
TOLERANCE_OF = {"minerva": "relative_1e-4"}
#: Perturbations aimed at the false positives this test guards against: always scored when a gold has them.
STRUCTURAL = ("list_reorder", "list_merge", "list_drop", "list_split", "equation_lhs", "equation_swap",
              "equation_rhs", "power", "factorial", "near_miss", "sign")
#: Per dataset: (other perturbations per row, gold answer forms per row, perturbed-answer form responses per row);
#: ``None`` = all. Each row takes its share round robin from its own list, so every kind is used on many rows while
#: the run stays bounded (DAPO-Math-17k has 17,917 integer golds).
BUDGET = {"dapo-math-17k": (1, 1, 1), "minerva": (2, None, 1)}
DEFAULT_BUDGET = (3, None, 1)


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


def _rotate(values: list, count: int | None, start: int) -> list:
    if count is None or count >= len(values):
        return list(values)
    return [values[(start + k) % len(values)] for k in range(count)]


def build_items(dataset: str, data_source: str | None = None) -> list[Item]:
    """Every gold row of ``dataset`` as test responses (scored with ``data_source``, default the dataset's).

    Per row: the gold in a box, its notation variants, its other answer forms, the ``first_digit`` perturbation
    (of the agreement table) and a :data:`BUDGET` share of the other perturbations, some of them also in the other
    answer forms.
    """
    _, default_source = DATASETS[dataset]
    source = data_source or default_source
    n_pert, n_gold_forms, n_pert_forms = BUDGET.get(dataset, DEFAULT_BUDGET)
    rows = gold_rows(dataset)
    golds = [g for _, _, g in rows]
    items: list[Item] = []
    for i, (row, _, gold) in enumerate(rows):
        other = next((o for o in golds[i + 1:] + golds[:i] if o.strip() != gold.strip()), gold + "1")
        all_cases = cases(gold, other, dapo_line=source.lower().startswith("math_dapo"))
        fixed = [c for c in all_cases if c.kind in ("gold", "variant", "first_digit")]
        fixed += [c for c in all_cases if c.kind in STRUCTURAL]
        gold_forms = _rotate([c for c in all_cases if c.kind == "form"], n_gold_forms, i)
        others = [c for c in all_cases if "@" not in c.kind and c.kind not in ("gold", "variant", "form",
                                                                                 "first_digit", *STRUCTURAL)
                  # another row's symbolic answer is slow to tell apart and says little: numbers only
                  and (c.kind != "other_row" or re.fullmatch(r"-?[\d.]+", gold))]
        chosen = _rotate(others, n_pert, i)
        scored = {c.answer for c in fixed + chosen if c.kind not in ("gold", "variant")}
        forms = _rotate([c for c in all_cases if "@" in c.kind and c.answer in scored], n_pert_forms, i)
        for case in fixed + gold_forms + chosen + forms:
            items.append(Item(dataset, source, row, case.kind, case.answer, case.response, gold))
    return items


class ItemTimeout(BaseException):
    """Raised by SIGPROF in a worker (a BaseException: math-verify's ``except Exception`` must not swallow it)."""


def _alarm(signum, frame):
    raise ItemTimeout()


#: Kinds that must score correct get the training reward's timeout; perturbations a shorter one (a timeout is
#: scored wrong, so it can only hide a false positive that takes longer than this to be accepted; the test
#: reports the count).
CORRECT_KINDS = ("gold", "variant", "form")


def score_chunk(chunk: list[Item], item_timeout_s: float, perturbed_timeout_s: float
                ) -> list[tuple[bool, bool | None, bool]]:
    """``(acc, reference verdict or None when not accepted, timed out)`` per item, in this (worker) process.

    Each item runs under a limit of *CPU* seconds of this process (``setitimer(ITIMER_PROF)``; wall time would make
    the outcome depend on the machine's load): ``item_timeout_s`` for the kinds that must score correct,
    ``perturbed_timeout_s`` for perturbations. A timed-out item is not accepted, as the reward scores a timeout
    wrong, and the same answer is not tried again in another form. The reference of an accepted item gets
    ``item_timeout_s``; one that times out leaves ``ref=None`` with ``acc=True`` ("unconfirmed"), which the test
    reports.
    """
    import signal

    from stapo_verl.rewards import compute_score

    signal.signal(signal.SIGPROF, _alarm)
    timed_out: set[tuple[str, str, str]] = set()
    out = []
    for it in chunk:
        key = (it.data_source, it.answer, it.gold)
        if key in timed_out:
            out.append((False, None, True))
            continue
        limit = item_timeout_s if it.kind in CORRECT_KINDS else perturbed_timeout_s
        try:
            signal.setitimer(signal.ITIMER_PROF, limit)
            acc = bool(compute_score(it.data_source, it.response, it.gold, timeout_s=0)["acc"])
        except ItemTimeout:
            timed_out.add(key)
            out.append((False, None, True))
            continue
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        ref = None
        if acc:
            try:
                signal.setitimer(signal.ITIMER_PROF, item_timeout_s)
                ref = reference_equivalent(it.answer, it.gold, TOLERANCE_OF.get(it.data_source, "exact"))
            except ItemTimeout:
                ref = None
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        out.append((acc, ref, False))
    return out


@dataclasses.dataclass
class Outcome:
    """Per item: accepted by ``compute_score``, the reference's verdict (None when not asked) and timed out."""

    item: Item
    acc: bool
    ref: bool | None
    timed_out: bool


def run(items: list[Item], workers: int | None = None, chunk_size: int = 100, item_timeout_s: float = 5.0,
        perturbed_timeout_s: float = 1.5, chunk_timeout_s: float = 600.0) -> tuple[list[Outcome], dict]:
    """Score ``items`` in a pebble process pool; returns the outcomes (in order) and run statistics.

    Chunks are handed out in the order of ``items``: put the expensive (symbolic) datasets first, so that the cheap
    ones fill the gaps at the end.

    A chunk that runs past ``chunk_timeout_s`` (an item stuck inside a C call, where the CPU timer cannot interrupt it)
    is killed by pebble and re-run item by item, each with pebble's timeout ``item_timeout_s``.
    """
    from concurrent.futures import TimeoutError as FutureTimeout

    import resource

    from pebble import ProcessPool

    workers = workers or min(2, os.cpu_count() or 1)
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    chunks = [items[i:i + chunk_size] for i in range(0, len(items), chunk_size)]
    results: list[list | None] = [None] * len(chunks)
    retried = 0
    with ProcessPool(max_workers=workers) as pool:
        futures = [pool.schedule(score_chunk, args=(c, item_timeout_s, perturbed_timeout_s), timeout=chunk_timeout_s)
                   for c in chunks]
        for i, fut in enumerate(futures):
            try:
                results[i] = fut.result()
            except FutureTimeout:
                retried += 1
        for i, res in enumerate(results):
            if res is not None:
                continue
            single = [pool.schedule(score_chunk, args=([it], item_timeout_s, perturbed_timeout_s),
                                    timeout=item_timeout_s + 30)
                      for it in chunks[i]]
            res = []
            for fut in single:
                try:
                    res.extend(fut.result())
                except FutureTimeout:
                    res.append((False, None, True))
            results[i] = res
    outcomes = [Outcome(it, a, r, t) for chunk, res in zip(chunks, results) for it, (a, r, t) in zip(chunk, res)]
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    stats = {"items": len(items), "chunks": len(chunks), "chunks_retried": retried,
             "timeouts": sum(o.timed_out for o in outcomes), "seconds": round(time.perf_counter() - t0, 1),
             "worker_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1)}
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
