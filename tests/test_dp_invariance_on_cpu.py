"""DP invariance: 2 gloo processes holding half a mini-batch each == 1 process holding all of it.

Covers the candidate gather (τ_h global, bug D8), the global kept-token count (D1/D2/D3) and the random
ablation's shared permutation. The DP recombination mirrors verl: each rank's loss is scaled by dp_size
(``agg_loss``), gradients are averaged and the reported loss is the DP average (``engine_workers.py``).
"""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import actor_config
from test_stapo_loss_on_cpu import _batch, _call, _set_global
from tensordict import TensorDict

from stapo_verl import state
from stapo_verl.state import KEEP_FIELD
from stapo_verl.worker_hooks import apply_s2t_to_minibatch


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loss_and_grad(b, rows, loss_mode, stats_source, group, dp_size):
    cfg = actor_config(loss_mode, stats_source=stats_source)
    state.MINIBATCH.mask_calls = 0  # the random ablation's seed counts mask calls; ranks share that history
    sub = {k: v[rows] for k, v in b.items() if k != "logp"}
    # current-policy route: p comes from log_prob itself, so start it at the old values (one policy for both)
    src_lp = b["logp"] if stats_source == "old_policy" else b["old"]
    logp = src_lp.detach()[rows].clone().requires_grad_(True)
    if stats_source == "old_policy":
        td = TensorDict({"old_log_probs": sub["old"], "entropy": sub["ent"], "advantages": sub["adv"],
                         "response_mask": sub["rm"].int()}, batch_size=[len(rows)])
        stats = apply_s2t_to_minibatch(td, cfg.policy_loss, group)
        keep = td[KEEP_FIELD].bool()
        n_tok = torch.tensor(float(keep.sum()))
    else:
        stats, keep = None, sub["rm"]
        n_tok = torch.tensor(float(sub["rm"].sum()))
    if group is not None:
        dist.all_reduce(n_tok, group=group)
    _set_global(cfg, dp_size=dp_size, batch_num_tokens=int(n_tok), global_batch_size=8)
    state.MINIBATCH.start(stats)
    # as stapo_ppo_loss hands them over: K of the mini-batch routes separately, response_mask = all valid tokens
    ctx_keep = keep if stats_source == "old_policy" else None
    tok = state.LOSS_CONTEXT.set(state.LossContext(entropy=sub["ent"], dp_group=group, keep=ctx_keep))
    try:
        loss, metrics = _call(loss_mode, cfg, old_log_prob=sub["old"], log_prob=logp, advantages=sub["adv"],
                              response_mask=sub["rm"].bool())
    finally:
        state.LOSS_CONTEXT.reset(tok)
        state.MINIBATCH.end()
    loss.backward()
    return loss.detach(), logp.grad, metrics


CASES = [("stapo", "old_policy"), ("stapo_random", "old_policy"), ("stapo_high_entropy", "old_policy"),
         ("stapo", "current_micro_batch")]


def _worker(rank, port, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    res = {}
    for loss_mode, src in CASES:
        b = _batch(bs=8, T=9, seed=21)
        rows = torch.arange(rank * 4, rank * 4 + 4)
        loss, grad, metrics = _loss_and_grad(b, rows, loss_mode, src, dist.group.WORLD, 2)
        losses = [torch.zeros(()) for _ in range(2)]
        grads = [torch.zeros_like(grad) for _ in range(2)]
        dist.all_gather(losses, loss.float())
        dist.all_gather(grads, grad)
        res[(loss_mode, src)] = (sum(losses) / 2, torch.cat(grads) / 2, metrics)  # DP-average as verl does
    if rank == 0:
        torch.save(res, out_path)
    dist.destroy_process_group()


@pytest.mark.parametrize("_", [0])
def test_two_gloo_ranks_equal_one_process(tmp_path, _):
    out = tmp_path / "dp.pt"
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    res = torch.load(out, weights_only=False)
    for loss_mode, src in CASES:
        b = _batch(bs=8, T=9, seed=21)
        loss1, grad1, m1 = _loss_and_grad(b, torch.arange(8), loss_mode, src, None, 1)
        loss2, grad2, m2 = res[(loss_mode, src)]
        assert m1["actor/stapo/num_masked"] > 0, loss_mode
        assert m1["actor/stapo/num_masked"] == m2["actor/stapo/num_masked"], loss_mode
        assert m1["actor/stapo/tau_h"] == pytest.approx(m2["actor/stapo/tau_h"]), loss_mode
        assert loss1.item() == pytest.approx(loss2.item(), rel=1e-6), loss_mode
        assert grad1.abs().sum() > 0
        torch.testing.assert_close(grad1, grad2, rtol=1e-10, atol=1e-12)
