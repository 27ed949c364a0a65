"""The lab's policy token masks: the paper's ablations of S2T (§4.4) and the 20-Entropy baseline (arXiv 2506.01939).
Registered when this module is imported, which the policy-loss config does when ``token_mask`` names one
(:data:`stapo_verl.core.masks.LAB_MASKS`).

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
"""

from __future__ import annotations

import torch

from stapo_verl.algo.selections import (
    full_selection,
    high_entropy_selection,
    mask_seed,
    random_selection,
    s2t_ablation_keep_mask,
    top_entropy_keep_mask,
)
from stapo_verl.core.masks import S2T_FIELDS
from stapo_verl.core.registry import register_policy_token_mask


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
