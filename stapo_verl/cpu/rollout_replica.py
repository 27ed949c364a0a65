"""``RolloutReplica`` for the CPU backend (registered as ``cpu`` in ``RolloutReplicaRegistry``).

Mirrors ``vLLMReplica.launch_servers`` (``verl.workers.rollout.vllm_rollout.vllm_async_server.vLLMReplica.launch_servers``):
one :class:`~stapo_verl.cpu.rollout_server.CPURolloutServer` actor per replica node, pinned to the node of the
replica's first trainer worker and named ``cpu_server_{replica_rank}_{node_rank}`` — the name is the contract
with :class:`~stapo_verl.cpu.rollout_adapter.CPUServerAdapter`.
"""

from __future__ import annotations

import asyncio

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.rollout.replica import RolloutReplica

from stapo_verl.cpu.rollout_server import CPURolloutServer, onednn_cache_env


def server_actor_name(prefix: str, replica_rank: int, node_rank: int, suffix: str = "") -> str:
    """Ray actor name of a CPU rollout server (the replica↔adapter naming contract)."""
    return f"{prefix}server_{replica_rank}_{node_rank}{suffix}"


class CPUReplica(RolloutReplica):
    """Rollout replica whose servers generate with HF ``transformers`` on CPU.

    Only the hybrid mode (``init_hybrid``, used by the sync v1 trainer) is exercised; the inherited
    colocated/standalone entry points also end in :meth:`launch_servers`.
    """

    def _get_server_name_prefix(self) -> str:
        return f"{self.config.name}_"

    def rollout_worker_use_gpu(self) -> bool:
        """False: the server generates on CPU (only read in colocated/standalone modes)."""
        return False

    async def launch_servers(self):
        """Create, load and register this replica's server actors.

        Raises:
            RuntimeError: the replica got no trainer workers (hybrid mode needs them for node placement).
        """
        if self.workers:
            node_ids = await asyncio.gather(
                *[w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for w in self.workers]
            )
        else:
            node_ids = [ray.get_runtime_context().get_node_id()] * max(1, self.world_size)
        if not node_ids:
            raise RuntimeError(f"CPUReplica {self.replica_rank}: no workers to place the server on")
        server_cls = ray.remote(CPURolloutServer)
        # the job's env_vars, plus the caps on oneDNN's kernel caches (onednn_cache_env: they bound its memory)
        job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
        runtime_env = {"env_vars": {**job_env, **onednn_cache_env()}}
        prefix = self._get_server_name_prefix()
        for node_rank in range(self.nnodes):
            node_id = node_ids[min(node_rank * self.gpus_per_replica_node, len(node_ids) - 1)]
            kind = "reward_" if self.is_reward_model else ("teacher_" if self.is_teacher_model else "")
            name = f"{prefix}server_{kind}{self.replica_rank}_{node_rank}{self.name_suffix}"
            server = server_cls.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                name=name,
                max_concurrency=self.max_concurrency,
                num_cpus=0,  # logical CPUs are all held by the placement groups; the server just shares cores
                runtime_env=runtime_env,
            ).remote(
                config=self.config,
                model_config=self.model_config,
                replica_rank=self.replica_rank,
                node_rank=node_rank,
            )
            self.servers.append(server)
        await asyncio.gather(*[s.launch_server.remote() for s in self.servers])
        address, port = await self.servers[0].get_server_address.remote()
        self._server_handle = self.servers[0]
        self._server_address = f"{address}:{port}"
