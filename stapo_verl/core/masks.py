"""The series' policy token mask ``s2t`` (STAPO's S2T, paper §3, Algorithm 1; p and H from verl's old-log-prob pass)
and ``loss_mode=stapo`` (verl's ``vanilla`` surrogate with ``token_mask=s2t``)."""

from __future__ import annotations

from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.core.registry import register_policy_token_mask

#: the mini-batch fields an S2T mask reads
S2T_FIELDS = ("old_log_probs", "entropy", "advantages", "response_mask")
#: ``token_mask`` values built on the S2T candidate population (the ones ``loss_mode=stapo`` accepts)
S2T_TOKEN_MASKS = ("s2t", "s2t_high_entropy", "s2t_random", "s2t_full")
#: the lab's masks (the paper's ablations, 20-Entropy), registered by :data:`LAB_MASK_MODULE` when a config names one
LAB_MASKS = ("s2t_high_entropy", "s2t_random", "s2t_full", "top_entropy")
LAB_MASK_MODULE = "stapo_verl.core.lab_masks"
#: every ``token_mask`` stapo-verl registers
TOKEN_MASKS = (*S2T_TOKEN_MASKS, "top_entropy")


class StapoLossError(RuntimeError):
    """Raised when ``loss_mode=stapo`` runs without an S2T token mask."""


@register_policy_token_mask("s2t", required_fields=S2T_FIELDS)
def compute_s2t_token_mask(batch, config, dp_group=None):
    """STAPO's S2T mask (arXiv 2602.15620, §3): keep every valid token but the spurious ones (Â > 0, p < τ_p,
    H < Quantile_q(P)), with ``policy_loss.s2t_tau_p`` and ``s2t_entropy_quantile``. ``batch``: the S2T_FIELDS,
    (bs, T) padded; returns ``(keep (bs, T) bool, metrics under "actor/stapo/")``."""
    return s2t_keep_mask(
        batch["old_log_probs"],
        batch["entropy"],
        batch["advantages"],
        batch["response_mask"],
        tau_p=config.policy_loss.s2t_tau_p,
        q=config.policy_loss.s2t_entropy_quantile,
        group=dp_group,
    )


@register_policy_loss("stapo")
def compute_policy_loss_stapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                              config=None, rollout_is_weights=None):
    """``loss_mode=stapo``: verl's ``compute_policy_loss_vanilla`` (``verl.trainer.ppo.core_algos``; its arguments
    and result) with an S2T token mask, which :func:`stapo_verl.core.losses.ppo_loss` applies around this call.

    Raises:
        StapoLossError: ``config.policy_loss.token_mask`` is not one of :data:`S2T_TOKEN_MASKS` (e.g. a caller
            that builds its own policy-loss config, such as verl's distillation loss).
    """
    token_mask = getattr(getattr(config, "policy_loss", None), "token_mask", None)
    if token_mask not in S2T_TOKEN_MASKS:
        raise StapoLossError(
            f"loss_mode='stapo' is verl's vanilla loss with an S2T token mask, but this call's config has "
            f"policy_loss.token_mask={token_mask!r} (allowed {list(S2T_TOKEN_MASKS)}); without it the run would be "
            "plain vanilla"
        )
    return compute_policy_loss_vanilla(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                                       response_mask=response_mask, loss_agg_mode=loss_agg_mode, config=config,
                                       rollout_is_weights=rollout_is_weights)
