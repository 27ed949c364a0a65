"""The worker's pre-pass over a data-parallel group of 2 gloo processes: per optimizer mini-batch the mask's
candidates travel in two tensor ``all_gather`` calls and its kept count in one ``all_reduce`` (what the upstream
series runs), the mask statistics in two tensor ``all_gather`` calls of their own (the plugin's diagnostics, none
when they are off; no ``all_gather_object``), and the statistics equal :func:`stapo_verl.diagnostics.stats.mask_statistics` over the whole
mini-batch in one process.

Each process runs the plugin's ``TrainingWorker.train_batch`` wrapper (``wrap_train_batch``) on its half of the same
mini-batch, with a stand-in for verl's own body, and counts the collectives ``torch.distributed`` runs between the
wrapper's start and the engine's forward/backward (the pre-pass, in the engine's train mode), and between that and the
wrapper's end (the statistics), for 2 mini-batches of an update.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from support.dp_invariance import use_cpu_platform
from support.verl_batches import actor_config, random_minibatch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

import stapo_verl.plugin  # noqa: F401  (the config class checks that the plugin is loaded)
from stapo_verl.core import losses as core_losses
from stapo_verl.core.losses import POLICY_LOSS_MASK_KEY, apply_policy_token_mask
from stapo_verl.diagnostics.stats import mask_statistics
from stapo_verl.integration.verl_0_9_1.training_worker import StapoPrepareBatch
from stapo_verl.integration.verl_0_9_1.worker import wrap_train_batch

#: |V| the stand-in worker's model reports (the silenced-gradient share's upper bound needs it)
VOCAB = 1000
#: (loss_mode, token_mask, mask_statistics)
CASES = (("stapo", None, True), ("vanilla", "s2t_random", True), ("vanilla", "s2t_high_entropy", True),
         ("stapo", None, False))
#: collective functions of torch.distributed that are counted
COLLECTIVES = ("all_gather_object", "all_gather", "all_reduce", "broadcast_object_list", "broadcast", "gather_object")


def _global_minibatch(step: int):
    return random_minibatch(bs=8, T=9, seed=30 + step)


def _worker_stub(cfg, rank: int):
    engine = SimpleNamespace(get_data_parallel_group=lambda: dist.group.WORLD, is_mp_src_rank_with_outputs=lambda: True,
                             get_data_parallel_rank=lambda: rank)
    return SimpleNamespace(loss_fn=functools.partial(core_losses.ppo_loss, config=cfg), engine=engine,
                           prepare_batch_fn=StapoPrepareBatch(cfg, {}),
                           model_config=SimpleNamespace(hf_config=SimpleNamespace(vocab_size=VOCAB)))


def _as_worker(worker, verl_body):
    from support.workers import as_training_worker

    return as_training_worker(worker, verl_body)


def _child(rank: int, init_file: str, queue) -> None:
    use_cpu_platform()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    counts = dict.fromkeys(COLLECTIVES, 0)
    for name in COLLECTIVES:  # this process only: count every collective the wrapper runs
        real = getattr(dist, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(dist, name, counting)
    at_verl_body = []

    def verl_body(self, data):  # stands in for verl's TrainingWorker.train_batch (the engine's forward/backward)
        at_verl_body.append(dict(counts))
        out = TensorDict({}, batch_size=[])
        tu.assign_non_tensor(out, metrics={})
        return out

    train_batch = wrap_train_batch(verl_body)
    report = []
    delta = lambda a, b: {k: a[k] - b[k] for k in COLLECTIVES if a[k] > b[k]}  # noqa: E731
    try:
        for loss_mode, token_mask, statistics in CASES:
            worker = _as_worker(_worker_stub(actor_config(loss_mode, token_mask, mask_statistics=statistics), rank),
                                verl_body)
            for step in range(2):
                td = tu.index_select_tensor_dict(_global_minibatch(step)["td"], torch.arange(rank * 4, rank * 4 + 4))
                tu.assign_non_tensor(td, global_steps=7, update_lr_scheduler=step == 1)
                before = dict(counts)
                out = train_batch(worker, td)
                during = (delta(at_verl_body[-1], before), delta(counts, at_verl_body[-1]))
                report.append(((loss_mode, token_mask, statistics, step), during, tu.get(out, "metrics")))
        queue.put((rank, report))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    ctx = mp.get_context("fork")  # the children inherit the imported modules; gloo on CPU
    queue = ctx.Queue()
    init = tmp_path_factory.mktemp("one_exchange") / "init"
    procs = [ctx.Process(target=_child, args=(rank, str(init), queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_the_mask_gathers_tensors_and_the_statistics_exchange_once(reports):
    for rank in (0, 1):
        for (loss_mode, token_mask, statistics, step), during, metrics in reports[rank]:
            case = (loss_mode, token_mask, statistics, step, rank)
            # the mask: counts and candidate rows in two tensor all_gathers, the kept-token count in one all_reduce,
            # before the engine's forward/backward; the statistics (when on), after it: two tensor all_gather calls,
            # no pickled exchange; nothing else
            assert during == ({"all_gather": 2, "all_reduce": 1}, {"all_gather": 2} if statistics else {}), case
            assert ("actor/stapo/silenced_grad_share" in metrics) == statistics, case
            assert metrics["actor/stapo/num_candidates"] > 0 and metrics["actor/stapo/num_masked"] > 0, case


def test_the_statistics_on_the_exchange_are_those_of_the_whole_minibatch(reports):
    for (loss_mode, token_mask, statistics, step), _, metrics in reports[0]:
        if not statistics:
            continue
        cfg = actor_config(loss_mode, token_mask)
        whole = _global_minibatch(step)["td"]
        tu.assign_non_tensor(whole, global_steps=7, mini_batch_index=step)
        mask_metrics = apply_policy_token_mask(cfg, whole, None)  # one process holds the whole mini-batch
        padded = {k: whole[k].to_padded_tensor(0) for k in ("old_log_probs", "entropy", "advantages",
                                                            "response_mask", "rollout_is_weights",
                                                            POLICY_LOSS_MASK_KEY)}
        expected = mask_statistics(padded["old_log_probs"], padded["entropy"], padded["advantages"],
                                   padded["response_mask"], padded[POLICY_LOSS_MASK_KEY].bool(),
                                   tau_p=cfg.policy_loss.s2t_tau_p, vocab_size=VOCAB, loss_agg_mode=cfg.loss_agg_mode,
                                   rollout_is_weights=padded["rollout_is_weights"]).to_metrics()
        assert expected.keys() <= metrics.keys()
        for key, value in {**expected, **mask_metrics}.items():
            assert _close(metrics[key], value), (loss_mode, token_mask, step, key, metrics[key], value)
        # the ranks agree (each computed the statistics of the whole mini-batch from the exchange)
        other = next(m for c, _, m in reports[1] if c == (loss_mode, token_mask, statistics, step))
        assert {k: other[k] for k in expected} == {k: metrics[k] for k in expected}
