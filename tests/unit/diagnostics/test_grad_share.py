"""The silenced-gradient share (``actor/stapo/silenced_grad_share`` and ``silenced_grad_share_upper``).

* Theorem 3.1's bounds (STAPO, arXiv 2602.15620; Yang et al. 2025, arXiv 2505.12929) against the EXACT norm of the
  logit gradient, from a full softmax: lower ≤ w² (1 − 2p + Σ_v π_v²) = ||∇_a (w log p)||² ≤ upper, token by token;
* the share against a brute-force float64 loop over the tokens of a mini-batch, with each token's PG weight read off
  verl's own loss by autograd (every ``loss_agg_mode``, rollout-correction weights), the mini-batch split over two
  ranks (the share is a ratio of sums over the whole mini-batch) and two mini-batches reduced as verl reduces a
  step's metrics (the mean over mini-batches, as ``masked_frac``);
* edge cases, input checks, and |V| read from the worker's model config.
"""

import math
from types import SimpleNamespace

import pytest
import torch
from support.verl_batches import AGG_MODES, actor_config
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.utils.metric import reduce_metrics
from verl.utils.py_functional import append_to_dict
from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits, entropy_from_logits

from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.diagnostics.stats import (
    combine,
    local_partials,
    logit_grad_norm_sq_bounds,
    mask_statistics,
    policy_gradient_weight,
)
from stapo_verl.integration.verl_0_9_1.training_worker import vocab_size_of

TAU_P = 0.01
VOCAB = 368  # the tiny run's Qwen3
SHARE, UPPER = "actor/stapo/silenced_grad_share", "actor/stapo/silenced_grad_share_upper"


def _logits(kind: str, n: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    if kind == "gauss":
        return torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3
    if kind == "peaked":  # one dominant entry per row: low entropy, the sampled token may be rare
        a = torch.randn(n, vocab, generator=g, dtype=torch.float64)
        a[torch.arange(n), torch.randint(vocab, (n,), generator=g)] += 12.0
        return a
    if kind == "uniform":  # both bounds are tight
        return torch.zeros(n, vocab, dtype=torch.float64)
    a = torch.zeros(n, vocab, dtype=torch.float64)  # two levels
    a[:, : max(1, vocab // 3)] = 4.0
    return a


@pytest.mark.parametrize("vocab", [2, 3, 7, 50])
@pytest.mark.parametrize("kind", ["gauss", "peaked", "uniform", "two"])
def test_bounds_enclose_the_exact_logit_gradient_norm_token_by_token(vocab, kind):
    g = torch.Generator().manual_seed(vocab * 7 + len(kind))
    n = 64
    a = _logits(kind, n, vocab, g).requires_grad_(True)
    y = torch.randint(vocab, (n,), generator=g)
    y[: n // 4] = a.detach().argmin(-1)[: n // 4]  # rare sampled tokens, the corner STAPO silences
    w = torch.randn(n, generator=g, dtype=torch.float64) * 2
    logp = torch.log_softmax(a, -1)[torch.arange(n), y]
    (grad,) = torch.autograd.grad((w * logp).sum(), a)  # row i holds ∇_{a_i} (w_i log p_i)
    exact = grad.square().sum(-1)
    pi = torch.softmax(a.detach(), -1)
    p = pi[torch.arange(n), y]
    closed = w**2 * (1 - 2 * p + calculate_sum_pi_squared_from_logits(a.detach()))  # w² (1 − 2p + Σ π²)
    torch.testing.assert_close(exact, closed, rtol=1e-9, atol=1e-12)
    H = entropy_from_logits(a.detach())
    lower, upper = logit_grad_norm_sq_bounds(logp.detach(), H, w, vocab)
    assert lower.dtype == upper.dtype == torch.float64
    slack = 1e-12 * (1 + w**2)
    assert (lower <= exact + slack).all(), (lower - exact).max()
    assert (exact <= upper + slack).all(), (exact - upper).max()
    assert (lower >= 0).all() and (lower > 0).any()
    if kind != "uniform":
        assert (upper > lower + slack).any()
    else:  # Σ π² = e^{−H} = 1 − C_V H² = 1/|V|: both bounds are the norm itself
        torch.testing.assert_close(lower, exact, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(upper, exact, rtol=1e-9, atol=1e-12)


def test_the_lower_bound_is_clamped_where_the_theorem_goes_negative():
    # π = (0.9, 0.1), y the 0.9 token: 1 − 2p + e^{−H} = −0.0775 < 0 < exact = (1 − p)² + 0.1² = 0.02
    lp = torch.tensor([math.log(0.9)], dtype=torch.float64)
    H = torch.tensor([-(0.9 * math.log(0.9) + 0.1 * math.log(0.1))], dtype=torch.float64)
    assert 1 - 1.8 + math.exp(-float(H)) == pytest.approx(-0.0775, abs=1e-4)
    lower, upper = logit_grad_norm_sq_bounds(lp, H, torch.tensor([2.0], dtype=torch.float64), vocab_size=2)
    assert float(lower) == 0.0
    assert 4 * 0.02 <= float(upper)


def _minibatch(seed: int, bs: int = 8, T: int = 14):
    """float64 (bs, T) inputs: ragged responses, planted low-p tokens, mixed-sign and zero advantages, rollout IS
    weights, one non-finite log-prob; and the S2T keep mask over the whole mini-batch."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(4, T + 1, (bs,), generator=g)
    lens[0] = T
    rm = torch.arange(T)[None, :] < lens[:, None]
    lp = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 1.5
    pick = torch.rand(bs, T, generator=g) < 0.3
    lp = torch.where(pick, math.log(1e-3) - 3 * torch.rand(bs, T, generator=g, dtype=torch.float64), lp)
    ent = torch.rand(bs, T, generator=g, dtype=torch.float64) * 4
    adv = torch.tensor([1.3, -0.4, 0.8, 0.0, -1.1, 2.0, 0.5, -0.7], dtype=torch.float64)[:bs, None].expand(bs, T)
    adv = adv.contiguous()
    isw = torch.rand(bs, T, generator=g, dtype=torch.float64) + 0.5
    lp[1, 2] = float("nan")  # a non-finite statistic: outside K and outside both sums
    keep, _ = s2t_keep_mask(lp, ent, adv, rm, tau_p=TAU_P, q=0.75)
    finite = torch.isfinite(lp) & torch.isfinite(ent)
    assert int((rm & finite & ~keep).sum()) > 2 and not keep[1, 2]  # silenced tokens; the NaN one is outside K
    return lp, ent, adv, rm, isw, keep


def _verl_weights(lp, adv, rm, isw, agg):
    """Each token's weight in verl's vanilla PG term before masking: −∂ loss / ∂ log π_θ at π_θ = π_old (ratio 1),
    by autograd through ``compute_policy_loss_vanilla`` with ``agg_loss``'s global batch info, float64."""
    cfg = actor_config("vanilla", agg=agg)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(rm.sum()), global_batch_size=rm.shape[0],
                                 loss_scale_factor=None)
    old = torch.nan_to_num(lp, nan=-1.0)
    logp = old.clone().requires_grad_(True)
    loss, _ = compute_policy_loss_vanilla(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=rm,
                                          loss_agg_mode=agg, config=cfg, rollout_is_weights=isw)
    (grad,) = torch.autograd.grad(loss, logp)
    return -grad


def _brute_force_share(lp, ent, rm, keep, weight, vocab):
    """Σ_silenced bound / Σ_valid bound, one token at a time in Python floats (float64)."""
    c_v = (vocab - 1) / (vocab * math.log(vocab) ** 2)
    sums = {"sil_lo": 0.0, "all_lo": 0.0, "sil_up": 0.0, "all_up": 0.0}
    bs, T = rm.shape
    for i in range(bs):
        for t in range(T):
            lpt, h = float(lp[i, t]), float(ent[i, t])
            if not (bool(rm[i, t]) and math.isfinite(lpt) and math.isfinite(h)):
                continue
            p, w2 = math.exp(lpt), float(weight[i, t]) ** 2
            lo, up = w2 * max(0.0, 1 - 2 * p + math.exp(-h)), w2 * max(0.0, 2 - 2 * p - c_v * h * h)
            sums["all_lo"] += lo
            sums["all_up"] += up
            if not bool(keep[i, t]):
                sums["sil_lo"] += lo
                sums["sil_up"] += up
    return sums["sil_lo"] / sums["all_lo"], sums["sil_up"] / sums["all_up"]


@pytest.mark.parametrize("agg", AGG_MODES)
def test_share_equals_a_brute_force_loop_over_the_mini_batch_split_over_two_ranks(agg):
    lp, ent, adv, rm, isw, keep = _minibatch(seed=11)
    oracle_w = _verl_weights(lp, adv, rm, isw, agg)
    # the weight up to the mode's one constant: token-mean's 1/N, seq-mean's 1/B, the norm mode's 1/(B·T)
    ours_w = policy_gradient_weight(adv, rm, agg, isw)
    ratio = (oracle_w[rm & (ours_w != 0)] / ours_w[rm & (ours_w != 0)]).unique()
    assert torch.allclose(ratio, ratio[0], rtol=1e-12) and ratio[0] > 0
    want_lo, want_up = _brute_force_share(lp, ent, rm, keep, oracle_w, VOCAB)
    assert 0.05 < want_lo < 0.95 and 0.05 < want_up < 0.95
    kw = dict(vocab_size=VOCAB, loss_agg_mode=agg, rollout_is_weights=isw)
    whole = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P, **kw).to_metrics()
    ranks = (slice(0, 3), slice(3, 8))  # uneven shards, as DP ranks hold them
    parts = [local_partials(lp[r], ent[r], adv[r], rm[r], keep[r], TAU_P, vocab_size=VOCAB, loss_agg_mode=agg,
                            rollout_is_weights=isw[r]) for r in ranks]
    split = combine(parts).to_metrics()
    for m in (whole, split):
        assert m[SHARE] == pytest.approx(want_lo, rel=1e-12)
        assert m[UPPER] == pytest.approx(want_up, rel=1e-12)
    # a mean of per-rank shares is a different (wrong) number: the reduction must be the ratio of global sums
    per_rank = [_brute_force_share(lp[r], ent[r], rm[r], keep[r], oracle_w[r], VOCAB)[0] for r in ranks]
    assert sum(per_rank) / 2 != pytest.approx(want_lo, rel=1e-3)


def test_the_aggregation_mode_changes_the_share_and_the_weights_are_taken_before_masking():
    lp, ent, adv, rm, isw, keep = _minibatch(seed=12)
    token = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P, vocab_size=VOCAB).to_metrics()[SHARE]
    seq = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P, vocab_size=VOCAB,
                          loss_agg_mode="seq-mean-token-mean").to_metrics()[SHARE]
    assert token != pytest.approx(seq, rel=1e-3)  # 1/L_i weights responses of different lengths differently
    # seq-mean-token-mean: 1/L_i with L_i the valid tokens before masking, not the kept ones
    w = policy_gradient_weight(adv, rm, "seq-mean-token-mean")
    torch.testing.assert_close(w, torch.where(rm, adv / rm.sum(-1, keepdim=True), 0.0), rtol=0, atol=0)


def test_two_mini_batches_reduce_like_masked_frac_the_mean_of_their_shares():
    per_mb, metrics = [], {}
    for seed in (21, 22):
        lp, ent, adv, rm, isw, keep = _minibatch(seed=seed)
        per_mb.append(_brute_force_share(lp, ent, rm, keep, _verl_weights(lp, adv, rm, isw, "token-mean"), VOCAB))
        m = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P, vocab_size=VOCAB, rollout_is_weights=isw)
        append_to_dict(metrics, m.to_metrics())  # what TrainingWorker.train_mini_batch does per mini-batch
    step = reduce_metrics(metrics)  # what the trainer does before logging
    assert per_mb[0][0] != pytest.approx(per_mb[1][0], rel=1e-3)
    assert step[SHARE] == pytest.approx((per_mb[0][0] + per_mb[1][0]) / 2, rel=1e-12)
    assert step[UPPER] == pytest.approx((per_mb[0][1] + per_mb[1][1]) / 2, rel=1e-12)


def test_edge_cases_stay_in_the_unit_interval_and_inputs_are_checked():
    lp, ent, adv, rm, isw, keep = _minibatch(seed=13)
    everything = mask_statistics(lp, ent, adv, rm, rm & torch.isfinite(lp) & (adv > 1e9), tau_p=TAU_P,
                                 vocab_size=VOCAB).to_metrics()
    assert everything[SHARE] == pytest.approx(1.0) and everything[UPPER] == pytest.approx(1.0)
    nothing = mask_statistics(lp, ent, adv, rm, rm, tau_p=TAU_P, vocab_size=VOCAB).to_metrics()
    assert nothing[SHARE] == 0.0 and nothing[UPPER] == 0.0
    no_signal = mask_statistics(lp, ent, torch.zeros_like(adv), rm, keep, tau_p=TAU_P, vocab_size=VOCAB)
    assert no_signal.to_metrics()[SHARE] == 0.0  # all weights 0: nothing carries a gradient, the key is still there
    without_vocab = mask_statistics(lp, ent, adv, rm, keep, tau_p=TAU_P).to_metrics()
    assert 0 < without_vocab[SHARE] < 1 and UPPER not in without_vocab
    lo, up = logit_grad_norm_sq_bounds(lp.bfloat16(), ent.bfloat16(), adv.bfloat16(), VOCAB)
    assert lo.dtype == up.dtype == torch.float32
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="vocabulary size"):
            logit_grad_norm_sq_bounds(lp, ent, adv, bad)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        policy_gradient_weight(adv, rm, "token-median")
    with pytest.raises(ValueError, match="one shape"):
        logit_grad_norm_sq_bounds(lp, ent, adv[:, :3])


def test_the_worker_reads_the_vocabulary_size_from_its_model_config():
    from transformers import Qwen3Config

    worker = SimpleNamespace(model_config=SimpleNamespace(hf_config=Qwen3Config(vocab_size=VOCAB)))
    assert vocab_size_of(worker) == VOCAB
    assert vocab_size_of(SimpleNamespace(model_config=SimpleNamespace(hf_config=None))) is None
    assert vocab_size_of(SimpleNamespace()) is None
