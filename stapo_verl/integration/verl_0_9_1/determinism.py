"""Same seed, same run, as a switch any verl job can set: per-request rollout seeds and a canonical batch order
(``+trainer.reproducible=True``, :data:`.job.REPRODUCIBLE_KEY`; ledger:
:data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

Two things in verl 0.9.1 make two runs with the same seed differ from the first step, whatever the hardware:

1. **Rollout seeds.** With ``rollout.full_determinism=True`` every vLLM request gets the same seed
   (``rollout.seed + replica_rank``), so the ``n`` samples of a prompt are the same response; without it no request
   is seeded. :func:`wrap_run_agent_loop` puts a per-request ``seed`` into the request's ``sampling_params``
   (:func:`stapo_verl.core.seeding.rollout_request_seed`: configured seed, step, train/validation, data source,
   dataset row, sample number); vLLM's server keeps it (it only ``setdefault``\\ s its own) and the CPU platform's
   server honours it the same way. ``rollout.full_determinism=True`` (verl's own key) adds vLLM's batch-invariant
   kernels, so that a request's logits do not depend on its batch.
2. **Batch order.** The v1 ``ReplayBuffer`` materialises a batch in the order TransferQueue saw the trajectories
   *finish*, which depends on timing; the order then decides the micro-batch split and the float summation order
   of the update. :func:`wrap_build_replay_buffer` wraps the buffer the trainer builds, on that instance:
   its ``_materialize_batch`` puts the trajectories in the order their prompts were submitted (then sample number,
   then output index), and its ``_select_prompt_uids`` breaks ties among prompts of the same step by submission
   order instead of set iteration order.

Both act only for a job that sets the switch (:func:`.job.request_of`); any other job, STAPO or not, gets verl's
seeds and verl's batch order, from verl's own methods, untouched.
"""

from __future__ import annotations

import functools

from stapo_verl.core.seeding import rollout_request_seed
from stapo_verl.integration.verl_0_9_1.job import record_acted, request_of

_MARK = "__stapo_integration__"
_RUN_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop.AgentLoopWorker._run_agent_loop"
_BUILD_REPLAY_BUFFER = "verl.trainer.ppo.v1.trainer_base.PPOTrainer._build_replay_buffer"
_SELECT = "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._select_prompt_uids"
_MATERIALIZE = "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer._materialize_batch"


def _scalar(value):
    """A tensor / numpy scalar as a plain Python value (trajectory fields come from a TensorDict)."""
    return value.item() if hasattr(value, "item") else value


def wrap_run_agent_loop(orig):
    """``AgentLoopWorker._run_agent_loop`` replacement: add the per-request ``seed`` when the job sets
    ``trainer.reproducible``; any other job's call is verl's own (same arguments, same result).

    A ``seed`` already in ``sampling_params`` (a user's agent loop) is kept.
    """

    @functools.wraps(orig)
    async def _run_agent_loop(self, sampling_params, trajectory, **kwargs):
        if not request_of(self, self.config).reproducible or "seed" in sampling_params:
            return await orig(self, sampling_params, trajectory, **kwargs)
        record_acted(_RUN_AGENT_LOOP)
        rollout = self.config.actor_rollout_ref.rollout
        sample_number = int(_scalar(kwargs.get("session_id", 0))) + int(trajectory.get("rollout_n", 0))
        seed = rollout_request_seed(
            int(rollout.seed), global_step=int(_scalar(trajectory["step"])), validate=bool(trajectory["validate"]),
            data_source=_scalar(kwargs.get("data_source")), sample_index=_scalar(trajectory["sample_index"]),
            sample_number=sample_number)
        return await orig(self, {**sampling_params, "seed": seed}, trajectory, **kwargs)

    setattr(_run_agent_loop, _MARK, True)
    return _run_agent_loop


def wrap_select_prompt_uids(orig):
    """A ``ReplayBuffer._select_prompt_uids`` (bound or not) that hands verl's stable sort by step the sampleable
    prompts in submission order (the order of ``self.prompt_global_steps[partition_id]``, TransferQueue's key
    order)."""

    @functools.wraps(orig)
    def _select_prompt_uids(self, partition_id, sampleable_keys, batch_size):
        record_acted(_SELECT)
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
    """A ``ReplayBuffer._materialize_batch`` (bound or not) that returns the batch in :func:`canonical_order` of the
    selected prompts."""

    @functools.wraps(orig)
    def _materialize_batch(self, partition_id, selected_prompt_uids, partition_snapshot):
        record_acted(_MATERIALIZE)
        batch = orig(self, partition_id, selected_prompt_uids, partition_snapshot)
        batch.reorder(canonical_order(batch.keys, list(selected_prompt_uids)))
        return batch

    setattr(_materialize_batch, _MARK, True)
    return _materialize_batch


def ordering(buffer):
    """Wrap one replay buffer's ``_select_prompt_uids`` and ``_materialize_batch`` on the instance (idempotent);
    returns ``buffer``. The class and every other instance keep verl's methods."""
    cls = type(buffer)
    for name, wrap in (("_select_prompt_uids", wrap_select_prompt_uids),
                       ("_materialize_batch", wrap_materialize_batch)):
        if name not in vars(buffer):
            wrapped = wrap(getattr(cls, name))
            setattr(buffer, name, functools.partial(wrapped, buffer))
    return buffer


def wrap_build_replay_buffer(orig):
    """``PPOTrainer._build_replay_buffer`` replacement: when the job sets ``trainer.reproducible``, the buffer verl
    built with its batches in canonical order (:func:`ordering`); any other job gets verl's buffer untouched.

    Raises:
        TypeError: the job sets the switch, but the buffer (a custom sampler,
            ``trainer.v1.sampler.custom_sampler``) has not verl's ``_select_prompt_uids`` / ``_materialize_batch``
            to put in order; the message names the switch and the fix.
    """

    @functools.wraps(orig)
    def _build_replay_buffer(self, *args, **kwargs):
        buffer = orig(self, *args, **kwargs)
        if not request_of(self, self.config).reproducible:
            return buffer
        record_acted(_BUILD_REPLAY_BUFFER)
        if not all(callable(getattr(buffer, name, None)) for name in ("_select_prompt_uids", "_materialize_batch")):
            raise TypeError(
                f"trainer.reproducible=True puts the replay buffer's batches in a canonical order, but "
                f"{type(buffer).__qualname__} (trainer.v1.sampler.custom_sampler) has no _select_prompt_uids / "
                "_materialize_batch of verl's ReplayBuffer. Fix: drop trainer.reproducible, or derive the sampler "
                "from verl.trainer.ppo.v1.replay_buffer.ReplayBuffer"
            )
        return ordering(buffer)

    setattr(_build_replay_buffer, _MARK, True)
    return _build_replay_buffer


def patch_agent_loop(module) -> None:
    """Post-import hook of ``verl.experimental.agent_loop.agent_loop`` (idempotent)."""
    cls = module.AgentLoopWorker
    if not getattr(cls._run_agent_loop, _MARK, False):
        cls._run_agent_loop = wrap_run_agent_loop(cls._run_agent_loop)


def patch_trainer_base(module) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.trainer_base``: wrap ``PPOTrainer._build_replay_buffer``
    (idempotent)."""
    cls = module.PPOTrainer
    if not getattr(cls._build_replay_buffer, _MARK, False):
        cls._build_replay_buffer = wrap_build_replay_buffer(cls._build_replay_buffer)
