"""Per-process state shared by the worker hook and the registered losses.

verl calls a registered policy loss with a fixed set of 7 keyword arguments (``verl/workers/utils/losses.py``),
so what the loss needs beyond them travels here:
  * :data:`MINIBATCH`: the S2T statistics of the optimizer mini-batch being trained (old-policy route), the
    running count of silenced tokens (current-policy route) and a mask counter (seeds ``stapo_random``);
    reset by the worker hook before every ``engine.train_batch``;
  * :data:`LOSS_CONTEXT`: the detached per-token entropy (bs, T) and the DP group of the current micro-batch,
    set by :func:`stapo_verl.worker_hooks.stapo_ppo_loss` around verl's ``ppo_loss``.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

import torch

from stapo_verl.s2t import MaskStats


@dataclass
class MiniBatchState:
    """State of the optimizer mini-batch currently inside ``engine.train_batch`` in this process.

    Attributes:
        stats: S2T statistics computed before the micro-batch loop (old-policy route), else None.
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

    def start(self, stats: MaskStats | None, detached_entropy: bool = False) -> None:
        """Begin a mini-batch (called by the worker hook)."""
        self.stats, self.removed_so_far, self.active = stats, 0, True
        self.detached_entropy = detached_entropy

    def end(self) -> None:
        """Leave the mini-batch; the loss refuses to run on stale statistics."""
        self.stats, self.removed_so_far, self.active, self.detached_entropy = None, 0, False, False


@dataclass
class LossContext:
    """What the loss sees beyond verl's 7 arguments for one micro-batch.

    Attributes:
        entropy: (bs, T) float32, detached current-policy entropy in nats (None if verl computed none).
        dp_group: the DP process group verl passed to ``ppo_loss`` (None for DP = 1).
    """

    entropy: torch.Tensor | None
    dp_group: object = None


MINIBATCH = MiniBatchState()
LOSS_CONTEXT: contextvars.ContextVar[LossContext | None] = contextvars.ContextVar("stapo_loss_context", default=None)
