"""Same seed, same run: per-request rollout seeds and a canonical batch order (ledger:
:data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

Two things in verl 0.9.1 make two runs with the same seed differ from the first step, whatever the hardware:

1. **Rollout seeds.** With ``rollout.full_determinism=True`` every vLLM request gets the same seed
   (``rollout.seed + replica_rank``), so the ``n`` samples of a prompt are the same response; without it no request
   is seeded. :func:`wrap_run_agent_loop` puts a per-request ``seed`` into the request's ``sampling_params``
   (:func:`stapo_verl.core.seeding.rollout_request_seed`: configured seed, step, train/validation, data source,
   dataset row, sample number) when ``full_determinism`` is on; vLLM's server keeps it (it only ``setdefault``\\ s
   its own) and the CPU platform's server honours it the same way.
2. **Batch order.** The v1 ``ReplayBuffer`` materialises a batch in the order TransferQueue saw the trajectories
   *finish*, which depends on timing; the order then decides the micro-batch split and the float summation order
   of the update. :func:`wrap_materialize_batch` puts the trajectories in the order their prompts were submitted
   (then sample number, then output index), and :func:`wrap_select_prompt_uids` breaks ties among prompts of the
   same step by submission order instead of set iteration order. Reordering a batch whose order verl leaves
   arbitrary changes no semantics, so both run for every job.
"""

from __future__ import annotations

import functools

from stapo_verl.core.seeding import rollout_request_seed

_MARK = "__stapo_integration__"


def _scalar(value):
    """A tensor / numpy scalar as a plain Python value (trajectory fields come from a TensorDict)."""
    return value.item() if hasattr(value, "item") else value


def wrap_run_agent_loop(orig):
    """``AgentLoopWorker._run_agent_loop`` replacement: add the per-request ``seed`` under ``full_determinism``.

    A ``seed`` already in ``sampling_params`` (a user's agent loop) is kept.
    """

    @functools.wraps(orig)
    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        rollout = self.config.actor_rollout_ref.rollout
        if rollout.get("full_determinism", False) and "seed" not in sampling_params:
            sample_number = int(_scalar(kwargs.get("session_id", 0))) + int(trajectory.get("rollout_n", 0))
            seed = rollout_request_seed(
                int(rollout.seed), global_step=int(_scalar(trajectory["step"])), validate=bool(trajectory["validate"]),
                data_source=_scalar(kwargs.get("data_source")), sample_index=_scalar(trajectory["sample_index"]),
                sample_number=sample_number)
            sampling_params = {**sampling_params, "seed": seed}
        return await orig(self, sampling_params, trajectory, **kwargs)

    setattr(_run_agent_loop, _MARK, True)
    return _run_agent_loop


def wrap_select_prompt_uids(orig):
    """``ReplayBuffer._select_prompt_uids`` replacement: hand verl's stable sort by step the sampleable prompts in
    submission order (the order of ``self.prompt_global_steps[partition_id]``, TransferQueue's key order)."""

    @functools.wraps(orig)
    def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
        rank = {uid: i for i, uid in enumerate(self.prompt_global_steps[partition_id])}
        return orig(self, partition_id, sorted(sampleable_keys, key=rank.__getitem__), batch_size)

    setattr(_select_prompt_uids, _MARK, True)
    return _select_prompt_uids


def canonical_order(keys: list[str], prompt_uids: list[str]) -> list[int]:
    """Permutation that sorts trajectory keys ``{uid}_{session_id}_{index}`` by (position of ``uid`` in
    ``prompt_uids``, ``session_id``, ``index``).

    Raises:
        KeyError: a key whose uid is not among ``prompt_uids``.
        ValueError: a key not of the form ``{uid}_{session_id}_{index}`` with integer session and index.
    """
    rank = {uid: i for i, uid in enumerate(prompt_uids)}

    def sort_key(j):
        uid, session_id, index = keys[j].rsplit("_", 2)
        return rank[uid], int(session_id), int(index)

    return sorted(range(len(keys)), key=sort_key)


def wrap_materialize_batch(orig):
    """``ReplayBuffer._materialize_batch`` replacement: the batch in :func:`canonical_order` of the selected prompts."""

    @functools.wraps(orig)
    def _materialize_batch(self, partition_id, selected_prompt_uids, partition_snapshot):
        batch = orig(self, partition_id, selected_prompt_uids, partition_snapshot)
        batch.reorder(canonical_order(batch.keys, list(selected_prompt_uids)))
        return batch

    setattr(_materialize_batch, _MARK, True)
    return _materialize_batch


def patch_agent_loop(module) -> None:
    """Post-import hook of ``verl.experimental.agent_loop.agent_loop`` (idempotent)."""
    cls = module.AgentLoopWorker
    if not getattr(cls._run_agent_loop, _MARK, False):
        cls._run_agent_loop = wrap_run_agent_loop(cls._run_agent_loop)


def patch_replay_buffer(module) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.replay_buffer`` (idempotent)."""
    cls = module.ReplayBuffer
    if not getattr(cls._select_prompt_uids, _MARK, False):
        cls._select_prompt_uids = wrap_select_prompt_uids(cls._select_prompt_uids)
    if not getattr(cls._materialize_batch, _MARK, False):
        cls._materialize_batch = wrap_materialize_batch(cls._materialize_batch)
