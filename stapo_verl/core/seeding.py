"""Per-request rollout seeds that depend on what a request is for, never on when it ran.

verl 0.9.1 with ``actor_rollout_ref.rollout.full_determinism=True`` gives every vLLM request the same seed
(``rollout.seed + replica_rank``, ``verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMHttpServer.generate``).
vLLM seeds one generator per request (``SamplingParams.seed``), so the ``rollout.n`` samples of one prompt, which
are identical requests, would all sample the same response and every GRPO group would have zero advantage. The
seed below is a function of the configured seed and of the request's place in training: global step, train or
validation, data source, the dataset row (``extra_info.index``) and the sample number within its group. Neither
batching, arrival order, the replica it is routed to nor a resume changes it.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: seeds are non-negative 63-bit integers (``torch.Generator.manual_seed`` and vLLM's ``SamplingParams.seed``)
SEED_BITS = (1 << 63) - 1


def rollout_request_seed(seed: int, *, global_step: int, validate: bool, data_source: Any, sample_index: Any,
                         sample_number: int) -> int:
    """Seed of one rollout request.

    Args:
        seed: ``actor_rollout_ref.rollout.seed``.
        global_step: verl's ``global_steps`` the prompt was drawn at (the trajectory's ``step``).
        validate: True for a validation request.
        data_source: the row's ``data_source`` (dataset rows of two sources may share an index).
        sample_index: the row's ``extra_info.index`` (the trajectory's ``sample_index``).
        sample_number: which of the ``n`` samples of the prompt (verl's ``session_id`` in the TransferQueue agent
            loop, ``rollout_n`` in the classic one).
    Returns:
        int in ``[0, 2**63)``: the first 8 bytes of BLAKE2b over the fields, so nearby inputs give unrelated
        seeds.
    Raises:
        ValueError: a negative ``global_step`` or ``sample_number``.
    """
    if int(global_step) < 0 or int(sample_number) < 0:
        raise ValueError(f"global_step={global_step} and sample_number={sample_number} must be >= 0")
    key = repr((int(seed), int(global_step), bool(validate), str(data_source), str(sample_index), int(sample_number)))
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big") & SEED_BITS
