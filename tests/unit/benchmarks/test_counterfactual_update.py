"""The counterfactual one-update experiment's parts (``benchmarks/counterfactual_update.py``): the random arm silences
exactly as many candidates as S2T, inside the candidates, per mini-batch; the optimizer state of a checkpoint loads
into verl's AdamW so that the next step equals the uninterrupted optimizer's; a mismatched state is refused."""

import copy

import pytest
import torch
from support.bench_modules import benchmark_module


@pytest.fixture(scope="module")
def cu():
    with benchmark_module("tiny_policy"), benchmark_module("bench_spurious_quadrants"), \
            benchmark_module("counterfactual_update") as module:
        yield module


def test_random_candidates_draws_the_count_inside_the_candidates(cu):
    cand = torch.zeros(6, 10, dtype=torch.bool)
    cand[::2, 3:8] = True  # 15 candidates
    got = cu.random_candidates(cand, 7, seed=5)
    assert int(got.sum()) == 7 and not bool((got & ~cand).any())
    assert torch.equal(got, cu.random_candidates(cand, 7, seed=5))
    assert not torch.equal(got, cu.random_candidates(cand, 7, seed=6))
    with pytest.raises(ValueError, match="exceeds the 15 candidates"):
        cu.random_candidates(cand, 16, seed=5)


def test_the_random_arm_silences_as_many_as_s2t_in_each_mini_batch(cu):
    from stapo_verl.algo.s2t import candidate_mask

    g = torch.Generator().manual_seed(0)
    B, T = 64, 12  # two optimizer mini-batches of 4 prompts x 8 samples
    batch = cu.tp.Batch(input_ids=None, attention_mask=None, prompt_len=None, responses=None,
                        response_mask=torch.rand(B, T, generator=g) < 0.9, scores=None, uid=None,
                        advantages=torch.randn(B, 1, generator=g).expand(B, T).clone(),
                        log_prob=torch.log(torch.rand(B, T, generator=g)), entropy=torch.rand(B, T, generator=g))
    mk = cu.masks(batch, tau_p=0.3, q=0.75, seed=1, step=4)
    valid = batch.response_mask
    assert torch.equal(mk["all"], valid)
    for sl in (slice(0, 32), slice(32, 64)):
        silenced = valid[sl] & ~mk["without_s2t"][sl]
        random = valid[sl] & ~mk["without_random"][sl]
        cand, _ = candidate_mask(batch.log_prob[sl], batch.entropy[sl], batch.advantages[sl], valid[sl], 0.3)
        assert int(silenced.sum()) == int(random.sum()) > 0
        assert not bool((random & ~cand).any()) and not bool((silenced & ~cand).any())
    assert not torch.equal(mk["without_s2t"], mk["without_random"])


def test_a_checkpoints_optimizer_state_continues_the_run(cu, tmp_path):
    from bench_spurious_quadrants import actor_config
    from verl.workers.config.optimizer import build_optimizer

    config = actor_config()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = build_optimizer(list(model.parameters()), config.optim)
    x = torch.randn(5, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    torch.save(opt.state_dict(), tmp_path / "optim_world_size_1_rank_0.pt")
    resumed = copy.deepcopy(model)
    loaded = cu.load_optimizer(resumed, tmp_path, config)
    for m, o in ((model, opt), (resumed, loaded)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="does not fit parameter 0"):
        cu.load_optimizer(torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Linear(3, 2)), tmp_path, config)
