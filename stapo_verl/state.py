"""Per-process state shared by the worker hook and the registered losses.

verl calls a registered policy loss with a fixed set of 7 keyword arguments (``verl/workers/utils/losses.py``),
so what the loss needs beyond them travels here:
  * :data:`MINIBATCH`: the S2T statistics of the optimizer mini-batch being trained (mini-batch routes
    ``old_policy``/``current_minibatch``), the running count of silenced tokens (``current_micro_batch``), the
    count of tokens whose *current* log-prob turned non-finite, and a mask counter (seeds ``stapo_random``);
    reset by the worker hook before every ``engine.train_batch``;
  * :data:`LOSS_CONTEXT`: the detached per-token entropy (bs, T), the micro-batch's keep mask K (bs, T) and the
    DP group of the current micro-batch, set by :func:`stapo_verl.worker_hooks.stapo_ppo_loss` around verl's
    ``ppo_loss``;
  * :data:`STEP`: the verl global step and the optimizer mini-batch index within it (token dump, mini-batch
    freshness), set by the worker hook around ``TrainingWorker.train_mini_batch``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

import torch

from stapo_verl.s2t import MaskStats


@dataclass
class MiniBatchState:
    """State of the optimizer mini-batch currently inside ``engine.train_batch`` in this process.

    Attributes:
        stats: S2T statistics computed before the micro-batch loop (mini-batch routes), else None.
        extra_metrics: further ``actor/stapo/...`` metrics of the mini-batch (e.g. ``mask_disagreement``),
            constant over its micro-batches, merged into the loss metrics.
        nonfinite_current: tokens of this rank whose current-policy log-prob was non-finite in the training
            forward (kept tokens only; dropped from the numerator), summed over the micro-batches so far.
        removed_so_far: global count of tokens silenced/dropped in the micro-batches processed so far
            (current-policy route: forms the running denominator).
        mask_calls: number of mask computations so far in this process (identical on all DP ranks).
        active: True between the hook's start and end of a STAPO mini-batch.
        detached_entropy: True when the loss reads current-policy entropy (Megatron then computes it
            gradient-free, :mod:`stapo_verl.megatron.entropy`).
    """

    stats: MaskStats | None = None
    removed_so_far: int = 0
    mask_calls: int = 0
    active: bool = False
    detached_entropy: bool = False
    extra_metrics: dict = field(default_factory=dict)
    nonfinite_current: int = 0

    def start(self, stats: MaskStats | None, detached_entropy: bool = False, extra_metrics: dict | None = None) -> None:
        """Begin a mini-batch (called by the worker hook)."""
        self.stats, self.removed_so_far, self.active = stats, 0, True
        self.detached_entropy = detached_entropy
        self.extra_metrics = dict(extra_metrics or {})
        self.nonfinite_current = 0

    def end(self) -> None:
        """Leave the mini-batch; the loss refuses to run on stale statistics."""
        self.stats, self.removed_so_far, self.active, self.detached_entropy = None, 0, False, False
        self.extra_metrics, self.nonfinite_current = {}, 0


@dataclass
class StepState:
    """Where this process is in verl's training loop (set by the worker hook).

    Attributes:
        global_step: verl's global step of the batch being trained (``global_steps`` of the TransferQueue
            samples), or the number of ``train_mini_batch`` calls in this process when the batch carries none.
        minibatch: index of the optimizer mini-batch within the step (0-based; counts over ``ppo_epochs``).
        rows_dumped: token-dump rows this rank has written for ``global_step`` (the per-step cap).
        update_calls: ``train_mini_batch`` calls so far in this process.
    """

    global_step: int = 0
    minibatch: int = 0
    rows_dumped: int = 0
    update_calls: int = 0


@dataclass
class LossContext:
    """What the loss sees beyond verl's 7 arguments for one micro-batch.

    Attributes:
        entropy: (bs, T) float32, detached current-policy entropy in nats (None if verl computed none).
        dp_group: the DP process group verl passed to ``ppo_loss`` (None for DP = 1).
        keep: (bs, T) bool keep mask K of this micro-batch from the mini-batch routes (the data field
            :data:`KEEP_FIELD`), None otherwise.
    """

    entropy: torch.Tensor | None
    dp_group: object = None
    keep: torch.Tensor | None = None


#: TensorDict field (response layout, like ``response_mask``) carrying the keep mask K of the mini-batch routes
#: into the engine's micro-batches; ``loss_mask``/``response_mask`` stay intact for the KL and entropy terms.
KEEP_FIELD = "stapo_keep"

MINIBATCH = MiniBatchState()
STEP = StepState()
LOSS_CONTEXT: contextvars.ContextVar[LossContext | None] = contextvars.ContextVar("stapo_loss_context", default=None)
