"""The policy token masks stapo-verl registers, and ``loss_mode=stapo`` (the paper's one flag).

=====================  =========================================================================================
``token_mask``         tokens removed from the policy-gradient term (within the candidates P: valid, Â > 0,
                       p < τ_p, gathered over the optimizer mini-batch and the DP group)
=====================  =========================================================================================
``s2t``                H < Quantile_q(P): STAPO's S2T mask (paper §3, Algorithm 1)
``s2t_high_entropy``   H > Quantile_{1-q}(P) (ablation, paper §4.4)
``s2t_random``         as many as ``s2t`` would silence, drawn uniformly; seeded by (``random_mask_seed``,
                       global step, mini-batch index) (ablation, paper §4.4)
``s2t_full``           all of P (JustRL-FullMask)
``top_entropy``        every token outside the ⌈ρ·N⌉ of highest entropy (the 20-Entropy baseline; ρ =
                       ``top_entropy_ratio``)
=====================  =========================================================================================

p and H are the old policy's (``old_log_probs`` and ``entropy`` from verl's old-log-prob pass), or the current
policy's with ``stats_source=current_minibatch`` (the plugin then hands the mask the current values under the same
field names). ``loss_mode=stapo`` is verl's ``vanilla`` surrogate with ``token_mask=s2t``.
"""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from stapo_verl.algo.s2t import s2t_keep_mask
from stapo_verl.algo.selections import (
    full_selection,
    high_entropy_selection,
    mask_seed,
    random_selection,
    s2t_ablation_keep_mask,
    top_entropy_keep_mask,
)
from stapo_verl.core.registry import register_policy_token_mask

#: the mini-batch fields an S2T mask reads
S2T_FIELDS = ("old_log_probs", "entropy", "advantages", "response_mask")
#: ``token_mask`` values built on the S2T candidate population (the ones ``loss_mode=stapo`` accepts)
S2T_TOKEN_MASKS = ("s2t", "s2t_high_entropy", "s2t_random", "s2t_full")
#: every ``token_mask`` this module registers
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


def _s2t_ablation(batch, config, dp_group, select):
    pl = config.policy_loss
    return s2t_ablation_keep_mask(batch["old_log_probs"], batch["entropy"], batch["advantages"],
                                  batch["response_mask"], tau_p=pl.s2t_tau_p, select=select, group=dp_group)


@register_policy_token_mask("s2t_high_entropy", required_fields=S2T_FIELDS)
def compute_s2t_high_entropy_token_mask(batch, config, dp_group=None):
    """Ablation: silence the high-entropy candidates (H > Quantile_{1−q}(P)); arguments and shapes as
    :func:`compute_s2t_token_mask`."""
    return _s2t_ablation(batch, config, dp_group, high_entropy_selection(config.policy_loss.s2t_entropy_quantile))


@register_policy_token_mask("s2t_full", required_fields=S2T_FIELDS)
def compute_s2t_full_token_mask(batch, config, dp_group=None):
    """Ablation (JustRL-FullMask): silence every candidate; arguments and shapes as :func:`compute_s2t_token_mask`."""
    return _s2t_ablation(batch, config, dp_group, full_selection())


def global_step_of(value) -> int:
    """verl's global step from the mini-batch field ``global_steps`` (an int, or one value per sample).

    Raises:
        ValueError: the field holds no integer.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            raise ValueError("the mini-batch field 'global_steps' is empty")
        return int(value.max())
    if isinstance(value, list | tuple):
        steps = [int(v) for v in value if v is not None]
        if not steps:
            raise ValueError(f"the mini-batch field 'global_steps' holds no step: {value!r}")
        return max(steps)
    if value is None:
        raise ValueError("the mini-batch field 'global_steps' is None")
    return int(value)


@register_policy_token_mask("s2t_random", required_fields=(*S2T_FIELDS, "global_steps", "mini_batch_index"))
def compute_s2t_random_token_mask(batch, config, dp_group=None):
    """Ablation: silence as many candidates as S2T would, drawn uniformly.

    The draw is seeded by :func:`stapo_verl.algo.selections.mask_seed` (``policy_loss.random_mask_seed``, verl's
    global step, the mini-batch index within the step), so it is identical on every DP rank and after a resume.
    Arguments and shapes as :func:`compute_s2t_token_mask`; ``batch`` also holds ``global_steps`` and
    ``mini_batch_index``.
    """
    pl = config.policy_loss
    seed = mask_seed(pl.random_mask_seed, global_step_of(batch["global_steps"]), int(batch["mini_batch_index"]))
    return _s2t_ablation(batch, config, dp_group, random_selection(pl.s2t_entropy_quantile, seed))


@register_policy_token_mask("top_entropy", required_fields=("entropy", "response_mask"))
def compute_top_entropy_token_mask(batch, config, dp_group=None):
    """20-Entropy baseline: keep the ⌈ρ·N⌉ tokens of highest entropy over the mini-batch (ρ = ``top_entropy_ratio``).

    Args:
        batch: ``entropy`` (bs, T) float and ``response_mask`` (bs, T), padded. config: reads
            ``policy_loss.top_entropy_ratio``. dp_group: the data-parallel group holding the mini-batch.

    Returns:
        ``(keep (bs, T) bool, metrics under "actor/top_entropy/")``.

    Source: Wang et al. 2025 (arXiv 2506.01939); the official code keeps the top ⌈ρ·N⌉ per micro-batch and rank
    with the current policy's entropy, renormalised over the kept tokens; here the population is the whole
    mini-batch across DP (the paper's batch formula) and the denominator is the exact kept count.
    """
    return top_entropy_keep_mask(batch["entropy"], batch["response_mask"], config.policy_loss.top_entropy_ratio,
                                 group=dp_group)


@register_policy_loss("stapo")
def compute_policy_loss_stapo(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights=None,
):
    """``loss_mode=stapo``: verl's ``vanilla`` PPO surrogate, run with an S2T token mask (the paper's one flag).

    The mask itself is applied around this call by :func:`stapo_verl.core.losses.ppo_loss` (``response_mask`` is
    already K here and ``batch_num_tokens`` is Σ K). Arguments and return value are those of verl's
    ``compute_policy_loss_vanilla`` (``verl.trainer.ppo.core_algos``).

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
    return compute_policy_loss_vanilla(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
    )
