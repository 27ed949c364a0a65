"""STAPO loss values, parity with verl's vanilla, micro-batch split invariance and numerical edge cases.

Spec §3.4 properties 1–7; verl ``compute_policy_loss_vanilla`` / ``agg_loss`` are the oracle.
"""

import math

import pytest
import torch
from helpers import actor_config
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn

from stapo_verl import state
from stapo_verl.config import StapoConfigError, StapoPolicyLossConfig
from stapo_verl.losses import StapoLossError
from stapo_verl.state import KEEP_FIELD
from stapo_verl.worker_hooks import apply_s2t_to_minibatch

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"]


def _call(loss_mode, cfg, **kw):
    return get_policy_loss_fn(loss_mode)(config=cfg, **kw)


def _set_global(cfg, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    cfg.global_batch_info.update(
        dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size, loss_scale_factor=None
    )


def _batch(bs=6, T=7, seed=0, spurious=True):
    """Random mini-batch in verl's padded response layout, with planted low-p/low-H tokens."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, T + 1, (bs,), generator=g)
    rm = torch.arange(T)[None, :] < lens[:, None]
    old = -torch.rand(bs, T, generator=g, dtype=torch.float64) * 2
    ent = torch.rand(bs, T, generator=g, dtype=torch.float64) * 3
    adv = torch.randn(bs, 1, generator=g, dtype=torch.float64).expand(bs, T).clone()
    adv[0] = 1.5  # at least one positive response
    if spurious:
        pick = torch.rand(bs, T, generator=g) < 0.35
        old = torch.where(pick, torch.full_like(old, math.log(1e-4)) - torch.rand(bs, T, generator=g), old)
    logp = (old + 0.3 * torch.randn(bs, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    weights = torch.rand(bs, T, generator=g, dtype=torch.float64) + 0.5
    return dict(old=old * rm, logp=logp, ent=ent, adv=adv * rm, rm=rm, w=weights)


def _apply_mask(b, cfg):
    td = TensorDict(
        {"old_log_probs": b["old"], "entropy": b["ent"], "advantages": b["adv"], "response_mask": b["rm"].int()},
        batch_size=[b["rm"].shape[0]],
    )
    td["loss_mask"] = td["response_mask"].clone()
    stats = apply_s2t_to_minibatch(td, cfg.policy_loss, None)
    # K travels separately; the masks the KL/entropy terms and the engine's count read stay intact
    assert torch.equal(td["response_mask"].bool(), b["rm"].bool()) and torch.equal(td["loss_mask"].bool(), b["rm"].bool())
    return td[KEEP_FIELD].bool(), stats


def test_closed_form_loss_value_and_gradient():
    # resp0 (Â=+2): p = [1e-3, .5, 1e-4, 1e-3], H = [.5, 1, .1, .9]; resp1 (Â=-1): 3 valid tokens + 1 pad.
    # candidates H {.5, .1, .9}: τ_h = .7 -> silence tokens 0 and 2. ratio = 1 everywhere.
    # kept: resp0 t1, t3 (loss -2 each), resp1 t0..t2 (+1 each) -> L = (-4 + 3) / 5 = -0.2 (vanilla: -5/7)
    old = torch.log(torch.tensor([[1e-3, 0.5, 1e-4, 1e-3], [0.3, 0.3, 0.3, 1.0]], dtype=torch.float64))
    logp = old.clone().requires_grad_(True)
    ent = torch.tensor([[0.5, 1.0, 0.1, 0.9], [0.2, 0.2, 0.2, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0] * 4, [-1.0] * 3 + [0.0]], dtype=torch.float64)
    rm = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    cfg = actor_config("stapo")
    keep, stats = _apply_mask(dict(old=old, ent=ent, adv=adv, rm=rm), cfg)
    assert keep.tolist() == [[False, True, False, True], [True, True, True, False]]
    assert stats.tau_h == pytest.approx(0.7)
    _set_global(cfg, batch_num_tokens=int(keep.sum()), global_batch_size=2)
    state.MINIBATCH.start(stats)
    try:
        loss, metrics = _call("stapo", cfg, old_log_prob=old, log_prob=logp, advantages=adv, response_mask=keep)
    finally:
        state.MINIBATCH.end()
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    expected = torch.tensor([[0, -0.4, 0, -0.4], [0.2, 0.2, 0.2, 0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)
    assert metrics["actor/stapo/num_masked"] == 2 and metrics["actor/stapo/masked_frac"] == pytest.approx(2 / 7)
    assert metrics["actor/stapo/masked_p_mean"] == pytest.approx((1e-3 + 1e-4) / 2)
    vanilla_cfg = actor_config("vanilla")
    v, _ = compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=old, advantages=adv, response_mask=rm, config=vanilla_cfg
    )
    assert v.item() == pytest.approx(-5 / 7)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("loss_mode", ["stapo", "stapo_full_mask"])
def test_equals_vanilla_when_nothing_is_masked(agg, loss_mode):
    b = _batch(spurious=False)
    cfg = actor_config(loss_mode, agg=agg, tau_p=1e-12)  # no candidates
    keep, stats = _apply_mask(b, cfg)
    assert stats.n_candidates == 0 and torch.equal(keep, b["rm"])
    n = int(b["rm"].sum())
    _set_global(cfg, batch_num_tokens=n, global_batch_size=6)
    vcfg = actor_config("vanilla", agg=agg)
    _set_global(vcfg, batch_num_tokens=n, global_batch_size=6)
    kw = dict(old_log_prob=b["old"], advantages=b["adv"], response_mask=b["rm"], loss_agg_mode=agg,
              rollout_is_weights=b["w"])
    lp2 = b["logp"].detach().clone().requires_grad_(True)
    v, vm = compute_policy_loss_vanilla(log_prob=lp2, config=vcfg, **kw)
    v.backward()
    state.MINIBATCH.start(stats)
    try:
        s, sm = _call(loss_mode, cfg, log_prob=b["logp"], **kw)
    finally:
        state.MINIBATCH.end()
    s.backward()
    assert vm["actor/pg_clipfrac"] > 0  # clipping is active in this batch
    torch.testing.assert_close(s, v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b["logp"].grad, lp2.grad, rtol=1e-12, atol=1e-12)
    for k in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert sm[k] == pytest.approx(vm[k], abs=1e-12)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_equals_vanilla_with_response_mask_K(agg):
    # spec §3.4 property 2: STAPO == vanilla(response_mask := K, batch_num_tokens := ΣK); silenced grads are 0.
    b = _batch(seed=3)
    cfg = actor_config("stapo", agg=agg)
    keep, stats = _apply_mask(b, cfg)
    assert stats.n_masked > 0
    _set_global(cfg, batch_num_tokens=int(keep.sum()), global_batch_size=6)
    vcfg = actor_config("vanilla", agg=agg)
    _set_global(vcfg, batch_num_tokens=int(keep.sum()), global_batch_size=6)
    lp2 = b["logp"].detach().clone().requires_grad_(True)
    v, _ = compute_policy_loss_vanilla(old_log_prob=b["old"], log_prob=lp2, advantages=b["adv"], response_mask=keep,
                                       loss_agg_mode=agg, config=vcfg)
    v.backward()
    state.MINIBATCH.start(stats)
    try:
        s, _ = _call("stapo", cfg, old_log_prob=b["old"], log_prob=b["logp"], advantages=b["adv"],
                     response_mask=keep, loss_agg_mode=agg)
    finally:
        state.MINIBATCH.end()
    s.backward()
    torch.testing.assert_close(s, v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b["logp"].grad, lp2.grad, rtol=1e-12, atol=1e-12)
    assert (b["logp"].grad[b["rm"] & ~keep] == 0).all()


def _run_split(b, cfg, n_micro, agg="token-mean"):
    """Loss + grad of one mini-batch processed as n_micro micro-batches (hook once, loss per micro-batch)."""
    keep, stats = _apply_mask(b, cfg)
    logp = b["logp"].detach().clone().requires_grad_(True)
    _set_global(cfg, batch_num_tokens=int(keep.sum()), global_batch_size=keep.shape[0])
    total = 0.0
    state.MINIBATCH.start(stats)
    try:
        for idx in torch.arange(keep.shape[0]).chunk(n_micro):
            loss, _ = _call("stapo", cfg, old_log_prob=b["old"][idx], log_prob=logp[idx], advantages=b["adv"][idx],
                            response_mask=keep[idx], loss_agg_mode=agg)
            loss.backward()
            total += loss.item()
    finally:
        state.MINIBATCH.end()
    return total, logp.grad


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_split_invariance(agg):
    b = _batch(bs=8, seed=5)
    l1, g1 = _run_split(b, actor_config("stapo", agg=agg), 1, agg)
    l4, g4 = _run_split(b, actor_config("stapo", agg=agg), 4, agg)
    assert l1 == pytest.approx(l4, rel=1e-12)
    torch.testing.assert_close(g1, g4, rtol=1e-12, atol=1e-14)


def test_current_micro_batch_route_exact_with_one_micro_batch_and_bounded_with_four():
    b = _batch(bs=8, seed=7)
    n_valid = int(b["rm"].sum())

    def run(n_micro):
        ccfg = actor_config("stapo", stats_source="current_micro_batch")
        _set_global(ccfg, batch_num_tokens=n_valid, global_batch_size=8)
        logp = b["logp"].detach().clone().requires_grad_(True)
        total = 0.0
        state.MINIBATCH.start(None)
        try:
            for idx in torch.arange(8).chunk(n_micro):
                tok = state.LOSS_CONTEXT.set(state.LossContext(entropy=b["ent"][idx]))
                try:
                    # current policy == old policy here, so the micro-batch masks use the same p and H
                    loss, m = _call("stapo", ccfg, old_log_prob=b["old"][idx], log_prob=b["old"][idx] + 0 * logp[idx],
                                    advantages=b["adv"][idx], response_mask=b["rm"][idx])
                finally:
                    state.LOSS_CONTEXT.reset(tok)
                total += loss.item()
        finally:
            state.MINIBATCH.end()
        return total

    # one micro-batch: the population is the whole mini-batch, denominator exact
    b1 = dict(b)
    b1["logp"] = b["old"].clone().requires_grad_(True)
    ref, _ = _run_split(b1, actor_config("stapo"), 1)
    assert run(1) == pytest.approx(ref, rel=1e-12)
    # four micro-batches: each mask comes from its own micro-batch population; the running denominator is
    # N_valid − M_≤j. Recompute that by hand with verl's vanilla, and bound it against the exact denominator
    # N_valid − M_total with the same masks: the relative gap is at most M_total / (N_valid − M_total).
    approx = run(4)
    from stapo_verl.s2t import s2t_keep_mask

    removed, by_hand, with_exact = 0, 0.0, []
    for idx in torch.arange(8).chunk(4):
        k, st = s2t_keep_mask(b["old"][idx], b["ent"][idx], b["adv"][idx], b["rm"][idx])
        removed += st.n_masked
        vcfg = actor_config("vanilla")
        _set_global(vcfg, batch_num_tokens=n_valid - removed, global_batch_size=8)
        v, _ = compute_policy_loss_vanilla(old_log_prob=b["old"][idx], log_prob=b["old"][idx],
                                           advantages=b["adv"][idx], response_mask=k, config=vcfg)
        by_hand += v.item()
        with_exact.append((v.item() * (n_valid - removed)))
    assert removed > 0
    assert approx == pytest.approx(by_hand, rel=1e-12)
    exact_den = sum(with_exact) / (n_valid - removed)
    assert abs(approx - exact_den) <= abs(exact_den) * removed / (n_valid - removed) + 1e-12


def test_all_tokens_masked_gives_finite_zero_and_connected_graph():
    old = torch.log(torch.full((2, 3), 1e-4, dtype=torch.float64))
    logp = old.clone().requires_grad_(True)
    adv = torch.ones(2, 3, dtype=torch.float64)
    rm = torch.ones(2, 3, dtype=torch.bool)
    cfg = actor_config("stapo_full_mask")
    keep, stats = _apply_mask(dict(old=old, ent=torch.rand(2, 3, dtype=torch.float64), adv=adv, rm=rm), cfg)
    assert not keep.any() and stats.n_masked == 6
    for bnt in (0, None):  # engine count of 0, and the no-global-info path
        _set_global(cfg, batch_num_tokens=bnt, global_batch_size=2)
        state.MINIBATCH.start(stats)
        try:
            loss, metrics = _call("stapo_full_mask", cfg, old_log_prob=old, log_prob=logp, advantages=adv,
                                  response_mask=keep)
        finally:
            state.MINIBATCH.end()
        assert loss.item() == 0.0 and loss.requires_grad
        loss.backward()
        assert torch.equal(logp.grad, torch.zeros_like(logp))
        assert all(math.isfinite(v) for v in metrics.values())
        logp.grad = None


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_log_prob_or_entropy_excluded_and_counted(bad):
    b = _batch(seed=11)
    b["old"][0, 0] = bad
    b["ent"][0, 1] = bad
    cfg = actor_config("stapo")
    keep, stats = _apply_mask(b, cfg)
    assert stats.n_nonfinite == 2 and not keep[0, 0] and not keep[0, 1]
    logp = b["logp"].detach().clone()
    logp[1, 0] = bad  # current policy non-finite too (e.g. bf16 overflow)
    logp.requires_grad_(True)
    _set_global(cfg, batch_num_tokens=int(keep.sum()), global_batch_size=6)
    state.MINIBATCH.start(stats)
    try:
        loss, m = _call("stapo", cfg, old_log_prob=b["old"], log_prob=logp, advantages=b["adv"], response_mask=keep)
    finally:
        state.MINIBATCH.end()
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    assert logp.grad[1, 0] == 0 and logp.grad[0, 0] == 0
    # 2 non-finite old-policy values + 1 current-policy log-prob that turned non-finite in the forward
    assert m["actor/stapo/nonfinite_tokens"] == 3


def test_no_candidates_and_one_candidate():
    old = torch.log(torch.tensor([[0.5, 0.4, 1e-3]], dtype=torch.float64))
    for n_cand, rm in ((0, torch.tensor([[1, 1, 0]], dtype=torch.bool)), (1, torch.ones(1, 3, dtype=torch.bool))):
        cfg = actor_config("stapo")
        b = dict(old=old, ent=torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64), adv=torch.ones(1, 3), rm=rm)
        keep, stats = _apply_mask(b, cfg)
        assert stats.n_candidates == n_cand and stats.n_masked == 0 and torch.equal(keep, rm)
        assert ("actor/stapo/tau_h" in stats.to_metrics()) == (n_cand == 1)


def test_old_policy_route_refuses_to_run_without_the_hook():
    cfg = actor_config("stapo")
    z = torch.zeros(1, 2)
    with pytest.raises(StapoLossError, match="mask was not applied"):
        _call("stapo", cfg, old_log_prob=z, log_prob=z, advantages=z, response_mask=z.bool())


def test_current_route_and_top_entropy_require_entropy():
    z = torch.zeros(1, 2)
    for mode, kw in (("stapo", {"stats_source": "current_micro_batch"}), ("top_entropy", {})):
        with pytest.raises(StapoLossError, match="calculate_entropy=True"):
            _call(mode, actor_config(mode, **kw), old_log_prob=z, log_prob=z, advantages=z, response_mask=z.bool())


def test_missing_fields_in_minibatch_are_named():
    td = TensorDict({"response_mask": torch.ones(1, 2)}, batch_size=[1])
    with pytest.raises(KeyError, match="old_log_probs"):
        apply_s2t_to_minibatch(td, StapoPolicyLossConfig(loss_mode="stapo"), None)


def test_plain_policy_loss_config_is_rejected_clearly():
    cfg = actor_config("vanilla")
    object.__setattr__(cfg.policy_loss, "loss_mode", "stapo")
    z = torch.zeros(1, 2)
    with pytest.raises(StapoLossError, match="_target_=stapo_verl.config.StapoPolicyLossConfig"):
        _call("stapo", cfg, old_log_prob=z, log_prob=z, advantages=z, response_mask=z.bool())


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"tau_p": 0.0}, "tau_p"),
        ({"tau_p": 1.0}, "tau_p"),
        ({"entropy_quantile": 0.0}, "entropy_quantile"),
        ({"entropy_quantile": 1.5}, "entropy_quantile"),
        ({"stats_source": "rollout"}, "stats_source"),
        ({"top_entropy_ratio": 0.0}, "top_entropy_ratio"),
        ({"top_entropy_normalizer": "seq"}, "top_entropy_normalizer"),
        ({"random_mask_seed": 1.5}, "random_mask_seed"),
        ({"loss_mode": "vanilla"}, "loss_mode"),
    ],
)
def test_invalid_config_values_name_the_key(kw, key):
    kw = {"loss_mode": "stapo", **kw}
    with pytest.raises(StapoConfigError, match=key):
        StapoPolicyLossConfig(**kw)


@pytest.mark.parametrize("normalizer,denominator", [("kept", 0.5 * 6), ("all_tokens", 6.0)])
def test_top_entropy_loss_closed_form(normalizer, denominator):
    # 6 valid tokens, ρ = 0.5 -> keep the 3 highest-entropy ones; ratio 1 so each token loss is −Â.
    ent = torch.tensor([[0.1, 2.0, 0.3, 1.5], [0.9, 0.2, 0.0, 0.0]], dtype=torch.float64)
    rm = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4], dtype=torch.float64)
    old = torch.zeros(2, 4, dtype=torch.float64)
    logp = old.clone().requires_grad_(True)
    cfg = actor_config("top_entropy", top_entropy_ratio=0.5, top_entropy_normalizer=normalizer)
    _set_global(cfg, batch_num_tokens=6, global_batch_size=2)
    tok = state.LOSS_CONTEXT.set(state.LossContext(entropy=ent))
    try:
        loss, m = _call("top_entropy", cfg, old_log_prob=old, log_prob=logp, advantages=adv, response_mask=rm)
    finally:
        state.LOSS_CONTEXT.reset(tok)
    # kept: H = 2.0 (Â=1), 1.5 (Â=1), 0.9 (Â=−2): Σ loss = −1 − 1 + 2 = 0; the gradient carries the scale
    assert loss.item() == pytest.approx(0.0, abs=1e-12)
    loss.backward()
    expected = torch.zeros(2, 4, dtype=torch.float64)
    expected[0, 1] = expected[0, 3] = -1.0 / denominator
    expected[1, 0] = 2.0 / denominator
    torch.testing.assert_close(logp.grad, expected)
    assert m["actor/top_entropy/kept_frac"] == pytest.approx(3 / 6)


def test_nonfinite_current_log_prob_is_counted_denominator_fixed_before_the_forward():
    # Issue 9 item 9: 1×3 batch, p = 0.5, Â = 1, no candidates; the current log-prob of token 2 is −inf.
    # The token is dropped from the numerator (zero gradient) and counted in nonfinite_tokens; the PG
    # denominator is Σ K = 3, fixed before the forward (like the engine's count), so L = −(1 + 1) / 3.
    old = torch.log(torch.full((1, 3), 0.5, dtype=torch.float64))
    cfg = actor_config("stapo")
    keep, stats = _apply_mask(dict(old=old, ent=torch.full((1, 3), 0.7, dtype=torch.float64),
                                   adv=torch.ones(1, 3, dtype=torch.float64), rm=torch.ones(1, 3, dtype=torch.bool)),
                              cfg)
    assert stats.n_candidates == 0 and stats.n_nonfinite == 0 and keep.all()
    logp = old.clone()
    logp[0, 2] = float("-inf")
    logp.requires_grad_(True)
    _set_global(cfg, batch_num_tokens=3, global_batch_size=1)
    state.MINIBATCH.start(stats)
    try:
        loss, m = _call("stapo", cfg, old_log_prob=old, log_prob=logp, advantages=torch.ones(1, 3, dtype=torch.float64),
                        response_mask=keep)
        assert state.MINIBATCH.nonfinite_current == 1
    finally:
        state.MINIBATCH.end()
    assert loss.item() == pytest.approx(-2 / 3)
    assert m["actor/stapo/nonfinite_tokens"] == 1.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("key,text,value", [("tau_p", "0.002", 0.002), ("entropy_quantile", " 0.5", 0.5),
                                            ("top_entropy_ratio", "1e-1", 0.1), ("random_mask_seed", "7", 7),
                                            ("dump_max_rows_per_step", "12", 12), ("clip_cov_ratio", "0.25", 0.25)])
def test_quoted_numeric_values_are_coerced_exactly_at_construction(key, text, value):
    # Issue 9 item 8: +...policy_loss.tau_p='0.002' reaches the dataclass as a string.
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    cfg = omega_conf_to_dataclass(OmegaConf.create({"_target_": "stapo_verl.config.StapoPolicyLossConfig",
                                                    "loss_mode": "stapo", key: text}))
    got = getattr(cfg, key)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("kw", [{"tau_p": True}, {"tau_p": "abc"}, {"tau_p": "nan"}, {"entropy_quantile": [0.5]},
                                {"random_mask_seed": "1.5"}, {"random_mask_seed": 2.0}, {"random_mask_seed": True},
                                {"dump_max_rows_per_step": "0"}, {"dump_tokens": "true"}, {"dump_dir": 3}])
def test_bad_scalar_values_are_rejected_naming_the_key(kw):
    (key,) = kw
    with pytest.raises(StapoConfigError, match=rf"actor_rollout_ref\.actor\.policy_loss\.{key}="):
        StapoPolicyLossConfig(loss_mode="stapo", **kw)


def test_dump_needs_a_minibatch_route():
    for kw in ({"stats_source": "current_micro_batch"}, {"loss_mode": "top_entropy"}):
        with pytest.raises(StapoConfigError, match="dump_tokens=True"):
            StapoPolicyLossConfig(**{"loss_mode": "stapo", "dump_tokens": True, **kw})
