"""What travels from the actor worker to the driver, and when: the data path of the tracker diagnostics.

A multi-node run has no shared disk, so the histograms and the silenced-token rows ride in the worker's train
output, the way verl returns its own metrics:

1. The driver's ``_update_actor`` wrapper puts :data:`REQUEST_KEY` into the update batch's ``extra_info`` (verl
   turns ``extra_info`` into non-tensor fields of every mini-batch): ``True`` when a token table is due at this
   step (:func:`table_due`), ``False`` for the histograms alone. No request (an older driver, another trainer): the
   worker sends nothing, so nothing can reach verl's metric reduction.
2. The worker's ``train_batch`` wrapper accumulates the step's histograms (and, when a table is due, the rows the
   token dump selected) on the worker instance; on the last mini-batch of the update it gathers the rows over the
   DP group (:func:`gather_rows`: ``all_gather_object`` on the ranks that return outputs, as verl gathers its
   metrics), capped (:func:`cap_rows`), and puts one :class:`DiagnosticsPayload` under :data:`PAYLOAD_KEY` into
   that mini-batch's output metrics.
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
    """

    step: int
    histograms: dict = field(default_factory=dict)
    rows: list | None = None
    rows_selected: int = 0


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


def gather_rows(rows: list[dict], group, *, max_rows: int, seed: int) -> tuple[list[dict], int]:
    """Every rank's rows, capped: each rank sends :func:`cap_rows` of its own, the union is capped again.

    ``all_gather_object`` over ``group`` (every rank of it must call this; without a group, this rank's rows only).

    Returns:
        ``(rows in rank order, capped to max_rows; how many rows the ranks had before any cap)``.
    """
    mine = (len(rows), cap_rows(rows, max_rows, seed))
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        parts = [mine]
    else:
        parts = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, mine, group=group)
    every = [r for _, part in parts for r in part]
    return cap_rows(every, max_rows, seed), sum(n for n, _ in parts)


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
