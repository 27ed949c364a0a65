"""What travels from the actor worker to the driver, and when: the data path of the tracker diagnostics.

A multi-node run has no shared disk (nodes need not share ``/tmp`` or the working directory), so the histograms and
the silenced-token rows ride in the worker's train output, the way verl returns its own metrics, and the driver
writes the token dump (every DP rank's file, in the run directory) and the tables:

1. The driver's ``_update_actor`` wrapper puts :data:`REQUEST_KEY` into the update batch's ``extra_info`` (verl
   turns ``extra_info`` into non-tensor fields of every mini-batch): ``True`` when a token table is due at this
   step (:func:`table_due`), ``False`` for the histograms alone. No request (an older driver, another trainer): the
   worker sends nothing, so nothing can reach verl's metric reduction.
2. The worker's ``train_batch`` wrapper accumulates the step's histograms and the rows the token dump selected
   (``dump_tokens``) on the worker instance; on the last mini-batch of the update it gathers the rows over the DP
   group by rank (:func:`gather_rows`: ``all_gather_object`` on the ranks that return outputs, as verl gathers its
   metrics; a rank that silenced nothing sends an empty list), and puts one :class:`DiagnosticsPayload` under
   :data:`PAYLOAD_KEY` into that mini-batch's output metrics, with the table's rows (:func:`table_rows`) when due.
3. ``TrainingWorker.train_mini_batch`` appends it, like any metric, to a list; the driver's wrapper takes the list
   out of the output (:func:`take_payloads`) **before** verl's ``reduce_metrics`` (which averages lists) sees it,
   and hands it to :mod:`stapo_verl.diagnostics.trackers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

#: non-tensor field of the update batch: the driver's request (bool: a token table is due this step)
REQUEST_KEY = "stapo_diagnostics_request"
#: key of the payload in the worker's output metrics (taken out by the driver before verl reduces the metrics)
PAYLOAD_KEY = "stapo/diagnostics_payload"


@dataclass
class DiagnosticsPayload:
    """One update's diagnostics as the driver receives them.

    Attributes:
        step: verl's global step.
        histograms: name → :class:`stapo_verl.diagnostics.stats.Histogram`, summed over the update's mini-batches
            (each already global over DP).
        rows: the token rows (schema :data:`stapo_verl.minibatch.dump_schema.SCHEMA`) of every DP rank, capped; None
            when no table was requested.
        rows_selected: rows the dump selected over the DP group before the caps (0 when no table was requested).
        dump: DP rank → that rank's token-dump rows of the update (an empty list when it silenced nothing), for every
            rank of the DP group; None when ``dump_tokens`` is off.
    """

    step: int
    histograms: dict = field(default_factory=dict)
    rows: list | None = None
    rows_selected: int = 0
    dump: dict | None = None


def table_due(step: int, *, dump_every: int | None, test_freq: int, total_steps: int) -> bool:
    """Whether the token table is logged at ``step``.

    Args:
        step: verl's global step (≥ 1).
        dump_every: ``policy_loss.dump_every``: None → at each validation (verl validates when ``test_freq > 0`` and
            ``step % test_freq == 0`` or at the last step), ``0`` → never, ``n ≥ 1`` → every n steps and at the last.
        test_freq: ``trainer.test_freq``. total_steps: the run's last step.

    Source: verl 0.9.1 ``PPOTrainer.fit`` (``verl.trainer.ppo.v1.trainer_base``) for the validation rule.
    """
    last = step >= total_steps
    if dump_every is None:
        return test_freq > 0 and (last or step % test_freq == 0)
    if dump_every == 0:
        return False
    return last or step % dump_every == 0


def cap_rows(rows: list[dict], max_rows: int, seed: int) -> list[dict]:
    """At most ``max_rows`` rows: silenced first (up to ⌈max_rows/2⌉), then as many kept candidates, drawn uniformly.

    Args:
        rows: token rows (``kind`` is ``"silenced"`` or ``"kept"``). max_rows: ≥ 1. seed: seed of the draw (the
            step, so every rank and a rerun agree).

    Returns:
        The chosen rows in their original order.
    """
    sil = [i for i, r in enumerate(rows) if r["kind"] == "silenced"]
    kept = [i for i, r in enumerate(rows) if r["kind"] != "silenced"]
    n_sil = min(len(sil), (max_rows + 1) // 2)
    n_kept = min(len(kept), n_sil, max_rows - n_sil)
    g = torch.Generator().manual_seed(int(seed))

    def draw(idx: list[int], n: int) -> list[int]:
        if n >= len(idx):
            return idx
        return [idx[j] for j in torch.randperm(len(idx), generator=g)[:n].tolist()]

    chosen = set(draw(sil, n_sil)) | set(draw(kept, n_kept))
    return [r for i, r in enumerate(rows) if i in chosen]


def gather_rows(rows: list[dict], group, *, dp_rank: int) -> dict[int, list[dict]]:
    """Every DP rank's rows, by rank: ``all_gather_object`` of ``(dp_rank, rows)`` over ``group`` (every rank of it
    must call this; without a group or with one rank, this rank's rows only).

    Returns:
        ``{dp_rank: rows}`` for every rank of the group, empty lists included.
    """
    mine = (int(dp_rank), rows)
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        parts = [mine]
    else:
        parts = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, mine, group=group)
    return {rank: part for rank, part in parts}


def table_rows(by_rank: dict[int, list[dict]], *, max_rows: int, seed: int) -> tuple[list[dict], int]:
    """The token table of an update: the rows of every rank in rank order, capped (:func:`cap_rows`).

    Returns:
        ``(at most max_rows rows; how many rows the ranks had before the cap)``.
    """
    every = [r for rank in sorted(by_rank) for r in by_rank[rank]]
    return cap_rows(every, max_rows, seed), len(every)


def take_payloads(metrics: dict) -> list[DiagnosticsPayload]:
    """Remove :data:`PAYLOAD_KEY` from a worker output's metrics dict (in place) and return its payloads.

    ``train_mini_batch`` appends each mini-batch's metrics to lists, so the value is a list of payloads (or a
    single one when the caller skipped that step).
    """
    value = metrics.pop(PAYLOAD_KEY, None)
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [p for p in items if isinstance(p, DiagnosticsPayload)]
