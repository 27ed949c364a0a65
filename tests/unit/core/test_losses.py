"""The policy-token-mask pre-pass and the masked ``ppo_loss``, against verl's own functions as the oracle.

* no mask configured: the plugin's ``ppo_loss`` is verl 0.9.1's (loss, gradient and metrics identical);
* a mask composes with every registered policy loss and every ``loss_agg_mode``: the policy-gradient (PG) term equals
  verl's policy loss evaluated with ``response_mask := K`` and ``batch_num_tokens := Σ K``;
* the KL and entropy terms are unchanged by the mask (``response_mask``, ``batch_num_tokens``);
* closed form, micro-batch split invariance, nothing kept, and the guards against training without the mask.
"""

import math

import pytest
import torch
from support.verl_batches import (
    AGG_MODES,
    actor_config,
    as_micro_batch,
    minibatch,
    model_output_for,
    random_minibatch,
)
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, compute_policy_loss_vanilla, get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.workers.utils.losses import ppo_loss as verl_ppo_loss
from verl.workers.utils.padding import response_to_nested

from stapo_verl.core.losses import (
    POLICY_BATCH_NUM_TOKENS_KEY,
    POLICY_LOSS_MASK_KEY,
    apply_policy_token_mask,
    ppo_loss,
)
from stapo_verl.core.masks import StapoLossError

#: verl policy losses the mask is composed with (every registered one except those needing extra inputs:
#: bypass_mode reads rollout log-probs, clip_cov/kl_cov draw random tokens — seeded below)
LOSS_MODES = sorted(m for m in POLICY_LOSS_REGISTRY if m not in ("bypass_mode", "stapo"))


def _kept(td):
    return td[POLICY_LOSS_MASK_KEY].to_padded_tensor(0).bool()


def _loss(fn, cfg, b, rows=None, entropy=False, **mb_kw):
    """One micro-batch through ``fn`` (a ppo_loss) with a fresh copy of the current log-probs."""
    rows = list(range(b["rm"].shape[0])) if rows is None else rows
    logp = b["logp"].detach().clone().requires_grad_(True)
    mb = as_micro_batch(b["td"], rows, **mb_kw)
    mo = model_output_for(mb, logp[rows], b["ent"][rows] if entropy else None)
    torch.manual_seed(0)  # clip_cov / kl_cov draw random tokens
    loss, metrics = fn(cfg, mo, mb)
    loss.backward()
    return loss.detach(), logp.grad, {k: (v.aggregate() if hasattr(v, "aggregate") else v) for k, v in metrics.items()}


@pytest.mark.parametrize("loss_mode", LOSS_MODES)
def test_without_a_mask_the_loss_is_verls(loss_mode):
    b = random_minibatch(seed=1)
    n = int(b["rm"].sum())
    cfg, vcfg = actor_config(loss_mode, use_kl_loss=True), actor_config(loss_mode, use_kl_loss=True)
    ours = _loss(ppo_loss, cfg, b, entropy=True, batch_num_tokens=n, global_batch_size=6)
    theirs = _loss(verl_ppo_loss, vcfg, b, entropy=True, batch_num_tokens=n, global_batch_size=6)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert ours[2] == theirs[2]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("loss_mode", LOSS_MODES)
def test_mask_composes_with_every_policy_loss_and_aggregation(loss_mode, agg):
    b = random_minibatch(seed=3)
    cfg = actor_config(loss_mode, "s2t", agg=agg)
    metrics = apply_policy_token_mask(cfg, b["td"])
    keep = _kept(b["td"])
    n_keep = int(keep.sum())
    assert 0 < metrics["actor/stapo/num_masked"] == int(b["rm"].sum()) - n_keep
    assert tu.get(b["td"], POLICY_BATCH_NUM_TOKENS_KEY) == n_keep == metrics["actor/policy_batch_num_tokens"]
    loss, grad, _ = _loss(ppo_loss, cfg, b, batch_num_tokens=int(b["rm"].sum()), global_batch_size=6)
    # oracle: verl's own policy loss with response_mask := K and batch_num_tokens := Σ K
    vcfg = actor_config(loss_mode, agg=agg)
    vcfg.global_batch_info.update(dp_size=1, batch_num_tokens=n_keep, global_batch_size=6, loss_scale_factor=None)
    logp = b["logp"].detach().clone().requires_grad_(True)
    w = keep.shape[1]  # padded to the longest response, as the engine's micro-batch is
    torch.manual_seed(0)
    v, _ = get_policy_loss_fn(loss_mode)(old_log_prob=b["old"][:, :w], log_prob=logp[:, :w],
                                          advantages=b["adv"][:, :w], response_mask=keep, loss_agg_mode=agg,
                                          config=vcfg, rollout_is_weights=b["w"][:, :w] * b["rm"][:, :w])
    v.backward()
    torch.testing.assert_close(loss, v.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, logp.grad, rtol=1e-12, atol=1e-12)
    assert (grad[:, :w][b["rm"][:, :w] & ~keep] == 0).all()  # silenced tokens get exactly zero gradient


def test_kl_and_entropy_terms_are_unchanged_by_the_mask():
    b = random_minibatch(seed=4)
    n = int(b["rm"].sum())
    kw = dict(use_kl_loss=True, kl_loss_coef=0.3, entropy_coeff=0.01)
    plain = _loss(ppo_loss, actor_config("vanilla", **kw), b, entropy=True, batch_num_tokens=n, global_batch_size=6)
    cfg = actor_config("vanilla", "s2t", **kw)
    apply_policy_token_mask(cfg, b["td"])
    masked = _loss(ppo_loss, cfg, b, entropy=True, batch_num_tokens=n, global_batch_size=6)
    assert masked[2]["kl_loss"] == plain[2]["kl_loss"] != 0
    assert masked[2]["actor/entropy_loss"] == plain[2]["actor/entropy_loss"] != 0
    assert masked[2]["actor/pg_loss"] != plain[2]["actor/pg_loss"]
    # the engine's count is untouched: response_mask/loss_mask are not modified by the pre-pass
    assert torch.equal(b["td"]["loss_mask"].to_padded_tensor(0).bool(), b["rm"])


def test_closed_form_value_and_gradient_of_loss_mode_stapo():
    # resp0 (Â=+2): p = [1e-3, .5, 1e-4, 1e-3], H = [.5, 1, .1, .9]; resp1 (Â=-1): 3 valid tokens + 1 pad.
    # candidates H {.5, .1, .9}: τ_h = .7 -> silence tokens 0 and 2. ratio = 1 everywhere.
    # kept: resp0 t1, t3 (loss -2 each), resp1 t0..t2 (+1 each) -> L = (-4 + 3) / 5 = -0.2 (vanilla: -5/7)
    b = minibatch(torch.log(torch.tensor([[1e-3, 0.5, 1e-4, 1e-3], [0.3, 0.3, 0.3, 1.0]], dtype=torch.float64)),
                  torch.tensor([[0.5, 1.0, 0.1, 0.9], [0.2, 0.2, 0.2, 0.0]], dtype=torch.float64),
                  torch.tensor([[2.0] * 4, [-1.0] * 3 + [0.0]], dtype=torch.float64),
                  torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool))
    cfg = actor_config("stapo")
    assert cfg.policy_loss.token_mask == "s2t"  # the one flag
    metrics = apply_policy_token_mask(cfg, b["td"])
    assert _kept(b["td"]).tolist() == [[False, True, False, True], [True, True, True, False]]
    assert metrics["actor/stapo/tau_h"] == pytest.approx(0.7)
    assert (metrics["actor/stapo/num_masked"], metrics["actor/stapo/renorm_factor"]) == (2.0, pytest.approx(7 / 5))
    loss, grad, m = _loss(ppo_loss, cfg, b, batch_num_tokens=7, global_batch_size=2)
    assert loss.item() == pytest.approx(-0.2)
    torch.testing.assert_close(grad, torch.tensor([[0, -0.4, 0, -0.4], [0.2, 0.2, 0.2, 0]], dtype=torch.float64))
    vanilla, _ = compute_policy_loss_vanilla(old_log_prob=b["old"], log_prob=b["old"], advantages=b["adv"],
                                             response_mask=b["rm"], config=actor_config("vanilla"))
    assert vanilla.item() == pytest.approx(-5 / 7)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_split_invariance(agg):
    b = random_minibatch(bs=8, seed=5)
    cfg = actor_config("stapo", agg=agg)
    apply_policy_token_mask(cfg, b["td"])
    n = int(b["rm"].sum())

    def run(chunks):
        logp = b["logp"].detach().clone().requires_grad_(True)
        total = 0.0
        for rows in torch.arange(8).chunk(chunks):
            mb = as_micro_batch(b["td"], rows.tolist(), batch_num_tokens=n, global_batch_size=8)
            loss, _ = ppo_loss(cfg, model_output_for(mb, logp[rows]), mb)
            loss.backward()
            total += loss.item()
        return total, logp.grad

    (l1, g1), (l4, g4) = run(1), run(4)
    assert l1 == pytest.approx(l4, rel=1e-12)
    torch.testing.assert_close(g1, g4, rtol=1e-12, atol=1e-14)


def test_nothing_kept_gives_a_finite_zero_attached_to_the_graph():
    b = random_minibatch(bs=2, T=3, seed=2)
    cfg = actor_config("vanilla", "s2t_full", s2t_tau_p=0.999)  # every positive-advantage token is a candidate
    b["td"]["advantages"] = response_to_nested(torch.ones(2, 3, dtype=torch.float64), b["td"]["response_mask"])
    apply_policy_token_mask(cfg, b["td"])
    assert not _kept(b["td"]).any() and tu.get(b["td"], POLICY_BATCH_NUM_TOKENS_KEY) == 0
    loss, grad, metrics = _loss(ppo_loss, cfg, b, batch_num_tokens=int(b["rm"].sum()), global_batch_size=2)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert all(math.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_statistics_are_excluded_and_cannot_reach_the_gradient(bad):
    b = random_minibatch(seed=11)
    old = b["old"].clone()
    old[0, 0] = bad
    ent = b["ent"].clone()
    ent[0, 1] = bad
    b["td"]["old_log_probs"] = response_to_nested(old, b["td"]["response_mask"])
    b["td"]["entropy"] = response_to_nested(ent, b["td"]["response_mask"])
    cfg = actor_config("stapo")
    metrics = apply_policy_token_mask(cfg, b["td"])
    keep = _kept(b["td"])
    assert metrics["actor/stapo/nonfinite_tokens"] == 2 and not keep[0, 0] and not keep[0, 1]
    loss, grad, _ = _loss(ppo_loss, cfg, b, batch_num_tokens=int(b["rm"].sum()), global_batch_size=6)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all() and grad[0, 0] == 0


def test_a_configured_mask_that_was_not_applied_raises():
    b = random_minibatch(seed=6)
    n = int(b["rm"].sum())
    with pytest.raises(KeyError, match="policy_batch_num_tokens"):  # the pre-pass's count, never a silent default
        _loss(ppo_loss, actor_config("cispo", "s2t"), b, batch_num_tokens=n, global_batch_size=6)


def test_missing_fields_are_named():
    b = random_minibatch(seed=6)
    del b["td"]["entropy"]
    with pytest.raises(KeyError, match=r"missing \['entropy'\]"):
        apply_policy_token_mask(actor_config("vanilla", "s2t"), b["td"])


def test_loss_mode_stapo_refuses_to_run_without_an_s2t_mask():
    z = torch.zeros(1, 2)
    with pytest.raises(StapoLossError, match="token_mask=None"):
        get_policy_loss_fn("stapo")(old_log_prob=z, log_prob=z, advantages=z, response_mask=z.bool(),
                                     config=actor_config("vanilla"))


def test_loss_mode_stapo_equals_vanilla_with_the_s2t_mask():
    b = random_minibatch(seed=8)
    n = int(b["rm"].sum())
    results = []
    for loss_mode, mask in (("stapo", None), ("vanilla", "s2t")):
        cfg = actor_config(loss_mode, mask)
        td = b["td"].copy()
        apply_policy_token_mask(cfg, td)
        results.append(_loss(ppo_loss, cfg, {**b, "td": td}, batch_num_tokens=n, global_batch_size=6))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_the_pg_term_reads_the_kept_count_and_the_other_terms_the_engines(monkeypatch):
    from verl.trainer.ppo import core_algos

    b = random_minibatch(seed=9)
    n = int(b["rm"].sum())
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))
    seen = []

    @core_algos.register_policy_loss("records")
    def records(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, **kw):
        seen.append(config.global_batch_info["batch_num_tokens"])
        return (log_prob * response_mask).sum(), {}

    cfg = actor_config("records", "s2t_full", s2t_tau_p=0.5)
    apply_policy_token_mask(cfg, b["td"])
    kept = tu.get(b["td"], POLICY_BATCH_NUM_TOKENS_KEY)
    assert kept < n  # the two denominators differ
    _loss(ppo_loss, cfg, b, batch_num_tokens=n, global_batch_size=6)
    assert seen == [kept]  # the PG term divided by the kept count ...
    assert cfg.global_batch_info["batch_num_tokens"] == n  # ... and the next terms read the engine's count again
