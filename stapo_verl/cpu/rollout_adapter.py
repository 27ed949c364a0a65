"""Worker-side ``BaseRollout`` adapter of the CPU backend (``_ROLLOUT_REGISTRY[("cpu", "async")]``).

Mirrors verl's vLLM ``ServerAdapter`` (``verl.workers.rollout.vllm_rollout.vllm_rollout.ServerAdapter``): rank
mapping, lazy ``ray.get_actor`` of the replica's server, and ``update_weights`` — here every rank drains the
weight generator (``full_tensor()`` is an FSDP collective), the rank owning the server clones the tensors
(FSDP2 state tensors alias live storage) and pushes them through the Ray object store.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Generator, Optional

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from stapo_verl.cpu.rollout_replica import server_actor_name

logger = logging.getLogger(__name__)


class CPUServerAdapter(BaseRollout):
    """Client of a :class:`~stapo_verl.cpu.rollout_server.CPURolloutServer` inside a trainer worker.

    Args:
        config: ``RolloutConfig`` (``name``, TP/DP/PP sizes, ``free_cache_engine``).
        model_config: ``HFModelConfig``.
        device_mesh: the rollout device mesh (unused on CPU).
        replica_rank: explicit replica rank, or ``-1`` to derive it from ``RANK``.
    Reads env ``RANK`` (default 0) and ``RAY_LOCAL_WORLD_SIZE`` (default 1).
    """

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        local_world_size = int(os.environ.get("RAY_LOCAL_WORLD_SIZE", "1"))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else int(replica_rank)
        self.rollout_rank = rank % world
        self.node_rank = self.rollout_rank // local_world_size
        self._has_server = self.rollout_rank == 0
        self.server_handle: Optional[ray.actor.ActorHandle] = None

    def _server(self) -> Optional[ray.actor.ActorHandle]:
        """The replica's server handle on the owning rank (looked up lazily: servers start after init_model)."""
        if not self._has_server:
            return None
        if self.server_handle is None:
            name = server_actor_name(f"{self.config.name}_", self.replica_rank, self.node_rank)
            try:
                self.server_handle = ray.get_actor(name)
            except ValueError as e:
                raise RuntimeError(f"CPU rollout adapter: Ray actor {name!r} not found (replica not launched?)") from e
        return self.server_handle

    async def resume(self, tags: list[str]):
        """Forward to ``server.wake_up`` when ``free_cache_engine`` (a no-op on the CPU server)."""
        if self.config.free_cache_engine and (server := self._server()) is not None:
            await server.wake_up.remote(tags=tags)

    async def release(self):
        """Forward to ``server.sleep`` when ``free_cache_engine`` (a no-op on the CPU server)."""
        if self.config.free_cache_engine and (server := self._server()) is not None:
            await server.sleep.remote()

    @torch.no_grad()
    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None],
                             global_steps: Optional[int] = None, wire_format: str = "named_tensors", **kwargs):
        """Push the actor's full weights to the server and stamp ``global_steps``.

        Args:
            weights: generator of ``(hf_name, tensor)`` (``engine.get_per_tensor_param``); may yield DTensors.
            global_steps: policy version for ``TokenOutput.extra_fields["global_steps"]``.
            wire_format: must be ``"named_tensors"``.
            **kwargs: ``peft_config``, ``base_sync_done`` … accepted and ignored.
        Raises:
            ValueError: ``wire_format`` other than ``"named_tensors"`` (the sync trainer never sends deltas).
        """
        if wire_format != "named_tensors":
            raise ValueError(f"CPU rollout adapter: wire_format={wire_format!r} unsupported (only 'named_tensors')")
        t0 = time.time()
        server = self._server()
        state = {}
        for name, tensor in weights:  # every rank drains: full_tensor() inside the generator is collective
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            if server is not None:
                state[name] = tensor.detach().to("cpu").clone()
        if server is not None:
            await server.update_weights.remote(ray.put(state))
            if global_steps is not None:
                await server.set_global_steps.remote(int(global_steps))
            logger.info("CPU rollout: pushed %d tensors in %.2fs (global_steps=%s)", len(state),
                        time.time() - t0, global_steps)
