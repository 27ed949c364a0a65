"""DP invariance: 2 gloo processes holding half a mini-batch each == 1 process holding all of it.

Covers the candidate gather (one τ_h for the mini-batch), the global kept-token count Σ K, the random ablation's
shared permutation and 20-Entropy's global top-k, composed with several verl losses. The DP recombination mirrors
verl: each rank's loss is scaled by dp_size (``agg_loss``), gradients are averaged and the reported loss is the DP
average (``TrainingWorker._postprocess_output``).
"""

import pytest
import torch
import torch.multiprocessing as mp
from support.dp_invariance import CASES, loss_and_grad, worker
from support.procs import free_port


def test_two_gloo_ranks_equal_one_process(tmp_path):
    out = tmp_path / "dp.pt"
    mp.spawn(worker, args=(free_port(), str(out)), nprocs=2, join=True)
    res = torch.load(out, weights_only=False)
    for loss_mode, token_mask, acted in CASES:
        loss1, grad1, m1 = loss_and_grad(list(range(8)), loss_mode, token_mask, None, 1)
        loss2, grad2, m2 = res[(loss_mode, token_mask)]
        assert m1 == m2, (loss_mode, token_mask)  # every mask statistic is global: identical to one process
        assert 0 < m1[acted] and (acted != "actor/top_entropy/kept_frac" or m1[acted] < 1)
        assert loss1.item() == pytest.approx(loss2.item(), rel=1e-6), (loss_mode, token_mask)
        assert grad1.abs().sum() > 0
        torch.testing.assert_close(grad1[:, : grad2.shape[1]], grad2, rtol=1e-10, atol=1e-12)
