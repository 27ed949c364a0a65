"""Through verl's real ``ppo_loss`` (``verl/workers/utils/losses.py``) with a tiny Qwen3 built here.

The S2T hook rewrites ``loss_mask``/``response_mask`` of the nested mini-batch; verl's ``ppo_loss`` then runs the
registered ``stapo`` loss; gradients flow into the model's weights.
"""

import dataclasses
import functools

import pytest
import torch
from helpers import actor_config
from tiny_qwen3 import make_minibatch, sequence_outputs, set_engine_info, tiny_qwen3
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, kl_penalty
from verl.utils.torch_functional import masked_sum
from verl.workers.utils.losses import ppo_loss
from verl.workers.utils.padding import no_padding_2_padding, response_to_nested

from stapo_verl import state
from stapo_verl.state import KEEP_FIELD
from stapo_verl.worker_hooks import apply_s2t_to_minibatch, stapo_ppo_loss


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_stapo_through_ppo_loss_reaches_model_weights():
    model = tiny_qwen3()
    td, seqs = make_minibatch(model)
    cfg = actor_config("stapo", tau_p=0.02)  # tiny random model: p ≈ 1/64, so τ_p above that yields candidates
    n_valid = int(td["response_mask"].values().sum())
    stats = apply_s2t_to_minibatch(td, cfg.policy_loss, None)
    assert stats.n_candidates >= 2 and stats.n_masked >= 1
    set_engine_info(td)
    assert td["batch_num_tokens"] == n_valid  # masks intact: the engine counts every valid token (KL/entropy)
    lp, _ = sequence_outputs(model, seqs, grad=True)
    state.MINIBATCH.start(stats)
    try:
        loss, metrics = stapo_ppo_loss({"log_probs": lp}, td, None, inner=functools.partial(ppo_loss, config=cfg))
    finally:
        state.MINIBATCH.end()
    loss.backward()
    grads = _grads(model)
    assert len(grads) == sum(1 for _ in model.parameters())
    assert all(torch.isfinite(g).all() for g in grads.values())
    assert grads["lm_head.weight"].abs().sum() > 0 and grads["model.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert metrics["actor/stapo/num_masked"].values == [float(stats.n_masked)]  # verl Metric, averaged over mbs
    # value: vanilla on K with the global kept count Σ K (exact renormalisation of the PG term)
    keep = td[KEEP_FIELD].to(torch.float32).to_padded_tensor(0.0).bool()
    assert int(keep.sum()) == n_valid - stats.n_masked
    lp_pad = no_padding_2_padding(lp, td).detach()
    vcfg = actor_config("vanilla")
    vcfg.global_batch_info.update(dp_size=1, batch_num_tokens=n_valid - stats.n_masked, global_batch_size=4)
    ref, _ = compute_policy_loss_vanilla(
        old_log_prob=td["old_log_probs"].to_padded_tensor(0.0), log_prob=lp_pad,
        advantages=td["advantages"].to_padded_tensor(0.0), response_mask=keep, config=vcfg)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_nothing_masked_equals_vanilla_ppo_loss_including_weight_gradients():
    model = tiny_qwen3(seed=3)
    td, seqs = make_minibatch(model, seed=4)
    cfg = actor_config("stapo", tau_p=1e-9)
    stats = apply_s2t_to_minibatch(td, cfg.policy_loss, None)
    assert stats.n_candidates == 0
    set_engine_info(td)
    lp, _ = sequence_outputs(model, seqs, grad=True)
    state.MINIBATCH.start(stats)
    try:
        s_loss, _ = stapo_ppo_loss({"log_probs": lp}, td, None, inner=functools.partial(ppo_loss, config=cfg))
    finally:
        state.MINIBATCH.end()
    s_loss.backward()
    g_stapo = _grads(model)
    model.zero_grad()
    td2, _ = make_minibatch(model, seed=4)
    set_engine_info(td2)
    vcfg = actor_config("vanilla", clip_c=10.0)
    lp2, _ = sequence_outputs(model, seqs, grad=True)
    v_loss, _ = ppo_loss(vcfg, {"log_probs": lp2}, td2)
    v_loss.backward()
    g_van = _grads(model)
    assert s_loss.item() == pytest.approx(v_loss.item(), rel=1e-6)
    for n in g_van:
        torch.testing.assert_close(g_stapo[n], g_van[n], rtol=1e-5, atol=1e-8)


def test_current_policy_entropy_is_detached_and_handed_to_the_loss():
    model = tiny_qwen3(seed=5)
    td, seqs = make_minibatch(model, seed=6)
    cfg = actor_config("stapo", tau_p=0.02, stats_source="current_micro_batch")
    set_engine_info(td)
    lp, ent = sequence_outputs(model, seqs, grad=True)
    assert ent.requires_grad
    seen = {}

    def spy(model_output, data, dp_group=None):
        seen["has_entropy"] = "entropy" in model_output
        seen["ctx"] = state.LOSS_CONTEXT.get()
        return ppo_loss(cfg, model_output, data, dp_group)

    spy.keywords = {"config": cfg}
    state.MINIBATCH.start(None)
    try:
        loss, metrics = stapo_ppo_loss({"log_probs": lp, "entropy": ent}, td, None, inner=spy)
    finally:
        state.MINIBATCH.end()
    assert seen["has_entropy"] is False  # entropy_coeff = 0: no entropy term, no entropy backward (D19/D20)
    assert not seen["ctx"].entropy.requires_grad and seen["ctx"].entropy.dtype == torch.float32
    torch.testing.assert_close(seen["ctx"].entropy, no_padding_2_padding(ent, td).detach().float())
    assert "actor/stapo/masked_frac" in metrics
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_kl_and_entropy_terms_see_every_valid_token_only_pg_is_masked():
    """use_kl_loss=True and entropy_coeff≠0 through verl's ppo_loss: S2T masks the PG term only (paper §3).

    Expected loss = PG(vanilla on K, ÷ Σ K) + β·KL(all valid, ÷ N_valid) − c·H(all valid, ÷ N_valid), i.e. the KL
    and entropy terms are exactly those of vanilla verl; silenced tokens still get the KL/entropy gradient.
    """
    model = tiny_qwen3(seed=7)
    td, seqs = make_minibatch(model, seed=8)
    n_valid = int(td["response_mask"].values().sum())
    g = torch.Generator().manual_seed(9)
    old_pad = td["old_log_probs"].to_padded_tensor(0.0)
    td["ref_log_prob"] = response_to_nested(old_pad + 0.3 * torch.randn(old_pad.shape, generator=g),
                                            td["response_mask"])  # TransferQueue layout, as _compute_ref_log_prob
    cfg = dataclasses.replace(actor_config("stapo", tau_p=0.02), use_kl_loss=True, kl_loss_coef=0.1,
                              kl_loss_type="low_var_kl", entropy_coeff=0.01)
    stats = apply_s2t_to_minibatch(td, cfg.policy_loss, None)
    assert stats.n_masked >= 1
    set_engine_info(td)
    lp, ent = sequence_outputs(model, seqs, grad=True)
    state.MINIBATCH.start(stats)
    try:
        loss, metrics = stapo_ppo_loss({"log_probs": lp, "entropy": ent}, td, None,
                                       inner=functools.partial(ppo_loss, config=cfg))
    finally:
        state.MINIBATCH.end()
    pad = lambda k: td[k].to(torch.float64).to_padded_tensor(0.0)  # noqa: E731
    valid, keep = pad("response_mask").bool(), pad(KEEP_FIELD).bool()
    lp_pad, ent_pad = no_padding_2_padding(lp, td).detach().double(), no_padding_2_padding(ent, td).detach().double()
    vcfg = actor_config("vanilla")
    vcfg.global_batch_info.update(dp_size=1, batch_num_tokens=int(keep.sum()), global_batch_size=4)
    pg, _ = compute_policy_loss_vanilla(old_log_prob=pad("old_log_probs"), log_prob=lp_pad,
                                        advantages=pad("advantages"), response_mask=keep, config=vcfg)
    kl = kl_penalty(logprob=lp_pad, ref_logprob=pad("ref_log_prob"), kl_penalty="low_var_kl")
    kl_term = masked_sum(kl, valid) / n_valid
    ent_term = masked_sum(ent_pad, valid) / n_valid
    expected = pg.item() + 0.1 * kl_term.item() - 0.01 * ent_term.item()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["kl_loss"].values[0] == pytest.approx(kl_term.item(), rel=1e-6)
    # a silenced token's log-prob still receives the KL (and entropy) gradient, and no PG gradient
    lp_leaf = lp.values().detach().clone().requires_grad_(True)
    lp2 = torch.nested.nested_tensor_from_jagged(lp_leaf, lp.offsets())
    state.MINIBATCH.start(stats)
    try:
        loss2, _ = stapo_ppo_loss({"log_probs": lp2}, td, None, inner=functools.partial(ppo_loss, config=cfg))
    finally:
        state.MINIBATCH.end()
    loss2.backward()
    grad = no_padding_2_padding(
        torch.nested.nested_tensor_from_jagged(lp_leaf.grad, lp.offsets()), td).double()
    silenced = valid & ~keep
    lp_req = lp_pad.clone().requires_grad_(True)
    (0.1 * masked_sum(kl_penalty(logprob=lp_req, ref_logprob=pad("ref_log_prob"), kl_penalty="low_var_kl"),
                      valid) / n_valid).backward()
    torch.testing.assert_close(grad[silenced], lp_req.grad[silenced], rtol=1e-5, atol=1e-9)
    assert grad[silenced].abs().min() > 0
