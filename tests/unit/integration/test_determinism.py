"""The determinism patches on their own (the switch ``trainer.reproducible``): the per-request seed in the agent loop
and the canonical batch order of the v1 ReplayBuffer (verl 0.9.1's own methods, called through the wrappers)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from stapo_verl.core.seeding import rollout_request_seed
from stapo_verl.integration.verl_0_9_1 import determinism as D


def _worker(reproducible: bool, seed: int = 7, full_determinism: bool = False):
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"full_determinism": full_determinism, "seed": seed}},
                            "trainer": {"reproducible": reproducible}})
    return SimpleNamespace(config=cfg)


def _run(worker, sampling_params, trajectory, **kwargs):
    seen = {}

    async def orig(self, sampling_params, trajectory, *, agent_name, trace=True, **kw):
        seen.update(sampling_params=sampling_params, kwargs=kw, agent_name=agent_name)
        return "out"

    out = asyncio.run(D.wrap_run_agent_loop(orig)(worker, sampling_params, trajectory, agent_name="single_turn_agent",
                                                  **kwargs))
    assert out == "out" and seen["agent_name"] == "single_turn_agent"
    return seen


TRAJ = {"step": 5, "sample_index": 11, "rollout_n": 0, "validate": False}


def test_seed_added_with_the_switch_per_sample():
    params = {"temperature": 1.0}
    seeds = [_run(_worker(True), params, TRAJ, session_id=i, data_source="math_dapo")["sampling_params"]["seed"]
             for i in range(4)]
    assert seeds == [rollout_request_seed(7, global_step=5, validate=False, data_source="math_dapo", sample_index=11,
                                          sample_number=i) for i in range(4)]
    assert len(set(seeds)) == 4 and params == {"temperature": 1.0}  # the caller's dict is not modified


def test_no_seed_without_the_switch_even_under_full_determinism_and_a_given_seed_is_kept():
    """verl's own full_determinism is verl's: without the switch the plugin adds no seed (verl's server then gives
    every request rollout.seed + replica_rank, as without the plugin)."""
    for full_determinism in (False, True):
        params = {"temperature": 1.0}
        seen = _run(_worker(False, full_determinism=full_determinism), params, TRAJ, session_id=0)
        assert seen["sampling_params"] is params
    assert _run(_worker(True), {"seed": 3}, TRAJ, session_id=1)["sampling_params"] == {"seed": 3}


def test_classic_agent_loop_numbers_samples_by_rollout_n():
    a = _run(_worker(True), {}, {**TRAJ, "rollout_n": 2})["sampling_params"]["seed"]
    assert a == rollout_request_seed(7, global_step=5, validate=False, data_source=None, sample_index=11,
                                     sample_number=2)


def test_canonical_order():
    keys = ["b_1_0", "a_0_0", "b_0_0", "a_10_0", "a_2_0", "a_2_1"]
    order = D.canonical_order(keys, ["a", "b"])
    assert [keys[j] for j in order] == ["a_0_0", "a_2_0", "a_2_1", "a_10_0", "b_0_0", "b_1_0"]
    with pytest.raises(KeyError):
        D.canonical_order(["c_0_0"], ["a"])
    with pytest.raises(ValueError):
        D.canonical_order(["a_x_0"], ["a"])


def test_replay_buffer_batch_in_submission_order_whatever_the_finish_order():
    """verl's own _select_prompt_uids / _materialize_batch (TransferQueue's kv_clear stubbed): trajectories that
    finished in any order come out in (submission, session, index) order, and ties of step keep submission order."""
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.ppo.v1 import replay_buffer as RB

    uids = [f"u{i:02d}-{random.Random(i).random()}" for i in range(6)]  # not sortable by name into submission order
    assert not hasattr(RB.ReplayBuffer._select_prompt_uids, "__wrapped__")  # the class keeps verl's methods
    select = D.wrap_select_prompt_uids(RB.ReplayBuffer._select_prompt_uids)
    finished = [f"{u}_{s}_0" for u in uids for s in range(3)]
    for trial in range(5):
        random.Random(trial).shuffle(finished)
        buf = SimpleNamespace(prompt_global_steps={"train": {u: 4 for u in uids}},
                              partitions={"train": {k: {"status": "success", "k": k} for k in finished}})
        chosen, snapshot, _ = select(buf, "train", set(uids), 4)
        assert chosen == uids[:4]

        def orig(self, partition_id, selected, partition_snapshot):
            keys = [k for k in partition_snapshot if k.split("_")[0] in set(selected)]
            return KVBatchMeta(partition_id=partition_id, keys=keys, tags=[partition_snapshot[k] for k in keys])

        batch = D.wrap_materialize_batch(orig)(buf, "train", chosen, snapshot)
        assert batch.keys == [f"{u}_{s}_0" for u in uids[:4] for s in range(3)]
        assert [t["k"] for t in batch.tags] == batch.keys
