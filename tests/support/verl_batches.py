"""verl objects for tests: actor configs as the worker builds them, and mini-/micro-batches in verl's layouts."""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig, PolicyLossConfig

from stapo_verl.integration.verl_0_9_1.policy_loss.config import StapoPolicyLossConfig

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean")


def actor_config(loss_mode: str = "vanilla", token_mask: str | None = None, *, clip_low=0.2, clip_high=0.28,
                 clip_c=10.0, agg="token-mean", use_kl_loss=False, kl_loss_coef=0.1, entropy_coeff=0.0,
                 **policy_loss) -> ActorConfig:
    """verl ``ActorConfig`` as ``ActorRolloutRefWorker.init_model`` builds it (``omega_conf_to_dataclass``).

    The policy-loss config is the plugin's :class:`StapoPolicyLossConfig` when ``loss_mode=stapo``, a
    ``token_mask`` or any plugin key is given, else verl's plain ``PolicyLossConfig``. ``dro`` gets the
    ``dro_beta`` it requires unless one is given.
    """
    import dataclasses

    if loss_mode == "dro":
        policy_loss.setdefault("dro_beta", 0.1)

    verl_keys = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    if loss_mode == "stapo" or token_mask is not None or set(policy_loss) - verl_keys:
        pl = StapoPolicyLossConfig(loss_mode=loss_mode, token_mask=token_mask, **policy_loss)
    else:
        pl = PolicyLossConfig(loss_mode=loss_mode, **policy_loss)
    return ActorConfig(
        strategy="fsdp2",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.2,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c,
        loss_agg_mode=agg,
        policy_loss=pl,
        rollout_n=1,
        use_kl_loss=use_kl_loss,
        kl_loss_coef=kl_loss_coef,
        kl_loss_type="low_var_kl",
        entropy_coeff=entropy_coeff,
    )


def tq_layout_batch(prompts, responses, attn):
    """The mini-batch layout verl's v1 trainer hands ``TrainingWorker`` (TransferQueue, ``agent_loop_tq``).

    Args:
        prompts: (bs, P) int64, left padded. responses: (bs, R) int64, right padded.
        attn: (bs, P + R) int64 attention mask (0 on padding); the response mask is ``attn[:, P:]``.

    Returns:
        verl TensorDict in the no-padding layout (``left_right_2_no_padding``) with unpadded nested
        ``prompts``/``responses``/``response_mask``/``loss_mask`` (``verl.workers.utils.padding``).
    """
    from verl.workers.utils.padding import left_right_2_no_padding

    bs, P = prompts.shape
    rmask = attn[:, P:].clone()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    td = TensorDict({"input_ids": torch.cat([prompts, responses], 1), "attention_mask": attn.clone(),
                     "response_mask": rmask, "position_ids": pos, "prompts": prompts.clone(),
                     "responses": responses.clone()}, batch_size=[bs])
    td = left_right_2_no_padding(td)
    valid = attn.bool()

    def nest(xs):
        return torch.nested.as_nested_tensor(xs, layout=torch.jagged)

    td["prompts"] = nest([prompts[i][valid[i, :P]] for i in range(bs)])
    td["responses"] = nest([responses[i][valid[i, P:]] for i in range(bs)])
    td["response_mask"] = nest([rmask[i][valid[i, P:]] for i in range(bs)])
    td["loss_mask"] = nest([rmask[i][valid[i, P:]] for i in range(bs)])
    return td


def minibatch(old, ent, adv, rm, *, logp=None, ref=None, w=None, prompt_len=3, seed=0):
    """A mini-batch given in the padded response layout, as the dict tests use plus its TransferQueue TensorDict.

    Args:
        old, ent, adv: (bs, T) float old-policy log-prob, entropy and advantage. rm: (bs, T) bool response mask
            (valid tokens first in each row). logp: the current log-prob (a leaf requiring grad is made from
            ``old`` when None). ref: reference log-prob; w: rollout IS weights (fields left out when None).

    Returns:
        dict with ``old``, ``logp``, ``ent``, ``adv``, ``rm`` (and ``ref``/``w`` when given) and ``td``: the mini-batch
        as ``TrainingWorker.train_batch`` receives it (nested response fields ``old_log_probs``, ``entropy``,
        ``advantages`` [, ``ref_log_prob``, ``rollout_is_weights``]).
    """
    from verl.workers.utils.padding import response_to_nested

    bs, T = rm.shape
    g = torch.Generator().manual_seed(seed)
    b = dict(old=old * rm, ent=ent * rm, adv=adv * rm, rm=rm.bool())
    b["logp"] = (old.detach().clone() if logp is None else logp.detach().clone()).requires_grad_(True)
    prompts = torch.randint(1, 50, (bs, prompt_len), generator=g)
    responses = torch.randint(1, 50, (bs, T), generator=g)
    attn = torch.cat([torch.ones(bs, prompt_len, dtype=torch.int64), rm.long()], 1)
    td = tq_layout_batch(prompts, responses, attn)
    # padded width = the longest response here (as in the TransferQueue layout, which carries no fixed width)
    tu.pop(td, "max_response_len")
    fields = [("old", "old_log_probs"), ("ent", "entropy"), ("adv", "advantages")]
    if ref is not None:
        b["ref"] = ref * rm
        fields.append(("ref", "ref_log_prob"))
    if w is not None:
        b["w"] = w
        fields.append(("w", "rollout_is_weights"))
    for key, name in fields:
        td[name] = response_to_nested(b[key], td["response_mask"])
    b["td"] = td
    return b


def random_minibatch(bs=6, T=7, seed=0, spurious=True):
    """A random :func:`minibatch` with planted low-p tokens, a reference log-prob and rollout IS weights."""
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
    logp = old + 0.3 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(bs, T, generator=g, dtype=torch.float64)
    weights = torch.rand(bs, T, generator=g, dtype=torch.float64) + 0.5
    return minibatch(old, ent, adv, rm, logp=logp, ref=ref, w=weights, seed=seed)


def model_output_for(td: TensorDict, log_prob: torch.Tensor, entropy: torch.Tensor | None = None) -> dict:
    """``model_output`` as the engines hand it to the loss: nested (bs, seq) values whose response positions
    (shifted left by one, as ``no_padding_2_padding`` reads them) hold ``log_prob`` (bs, T) — graph kept."""
    prompt_lens = td["prompts"].offsets().diff().tolist()
    response_lens = td["responses"].offsets().diff().tolist()

    def nest(x):
        rows = []
        for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
            pad = torch.zeros(pl - 1, dtype=x.dtype)
            rows.append(torch.cat([pad, x[i, :rl], torch.zeros(1, dtype=x.dtype)]))
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    out = {"log_probs": nest(log_prob)}
    if entropy is not None:
        out["entropy"] = nest(entropy)
    return out


def as_micro_batch(td: TensorDict, rows, *, dp_size=1, batch_num_tokens=None, global_batch_size=None) -> TensorDict:
    """Rows of a mini-batch as the engine passes one micro-batch to the loss (with verl's non-tensor fields);
    split with verl's own ``tensordict_utils.index_select_tensor_dict``."""
    mb = tu.index_select_tensor_dict(td, torch.as_tensor(rows))
    tu.assign_non_tensor(mb, dp_size=dp_size, batch_num_tokens=batch_num_tokens,
                         global_batch_size=global_batch_size)
    for key in ("policy_batch_num_tokens", "global_steps", "mini_batch_index"):
        if key in td.keys() and key not in mb.keys():
            tu.assign_non_tensor(mb, **{key: tu.get(td, key)})
    return mb
