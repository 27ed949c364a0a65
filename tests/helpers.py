"""Test helpers: build verl actor configs with a STAPO policy loss (no Hydra needed)."""

from __future__ import annotations

from verl.workers.config import ActorConfig, PolicyLossConfig

from stapo_verl.config import StapoPolicyLossConfig


def actor_config(loss_mode: str = "stapo", clip_low=0.2, clip_high=0.28, clip_c=10.0, agg="token-mean", **pl_kwargs):
    """verl ``ActorConfig`` as the worker builds it (``omega_conf_to_dataclass``), with our policy_loss."""
    if loss_mode == "vanilla":
        pl = PolicyLossConfig(loss_mode="vanilla")
    else:
        pl = StapoPolicyLossConfig(loss_mode=loss_mode, **pl_kwargs)
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
    )


def tq_layout_batch(prompts, responses, attn):
    """The mini-batch layout verl's v1 trainer hands ``TrainingWorker`` (TransferQueue, ``agent_loop_tq``).

    Args:
        prompts: (bs, P) int64, left padded. responses: (bs, R) int64, right padded.
        attn: (bs, P + R) int64 attention mask (0 on padding); the response mask is ``attn[:, P:]``.
    Returns:
        verl TensorDict in the no-padding layout (``left_right_2_no_padding``) with unpadded nested
        ``prompts``/``responses``/``response_mask``/``loss_mask`` (verl ``workers/utils/padding.py``).
    """
    import torch
    from tensordict import TensorDict
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
