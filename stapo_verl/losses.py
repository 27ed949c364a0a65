"""Policy losses registered in verl's ``POLICY_LOSS_REGISTRY``: STAPO, its ablations and 20-Entropy.

Every loss is verl's own ``compute_policy_loss_vanilla`` (clipping, dual clip ``clip_ratio_c``,
``rollout_is_weights``, every ``loss_agg_mode``) evaluated with ``response_mask := K`` (the keep mask) and,
for ``token-mean``, ``batch_num_tokens := Σ K`` over the optimizer mini-batch and all DP ranks
(spec §3.4 property 2). Nothing of the surrogate is re-derived here.

Only the policy-gradient term is masked (paper §3: S2T silences the PG contribution of spurious tokens).
verl's ``ppo_loss`` adds the KL term (``use_kl_loss``) and the entropy term over ``data['response_mask']``
normalised by the engine's ``batch_num_tokens`` (= Σ ``loss_mask``); the mini-batch routes leave both masks
intact and hand K to the loss separately (data field ``stapo_keep`` → :data:`stapo_verl.state.LOSS_CONTEXT`),
so KL and entropy see every valid token exactly as in vanilla verl while the PG term is renormalised by the
global Σ K computed before the forward.

Non-finite values: a token whose old-policy log-prob or entropy is non-finite is outside K (and outside Σ K). A
token whose *current* log-prob (or IS weight) turns non-finite in the training forward is dropped from the
numerator (``torch.where``, zero gradient) but stays in the denominator Σ K, which both the engine and the hook
fix before the forward (it weighs like a token with Â = 0); ``actor/stapo/nonfinite_tokens`` counts both kinds
(global over the mini-batch and DP; the hook replaces verl's micro-batch average by the exact total).

All functions share verl's ``PolicyLossFn`` signature (``verl/trainer/ppo/core_algos.py``), are called with
keyword arguments only, and return ``(scalar loss, {"actor/...": float})``:

    old_log_prob, log_prob, advantages: (bs, T) float (log_prob carries the graph);
    response_mask: (bs, T) bool; loss_agg_mode: str; config: verl ``ActorConfig`` whose ``policy_loss`` is a
    :class:`stapo_verl.config.StapoPolicyLossConfig`; rollout_is_weights: (bs, T) float or None.

Loss modes:
    ``stapo``               S2T: silence candidates below τ_h (paper §3, Eq. for J_STAPO).
    ``stapo_high_entropy``  ablation: silence the candidates above the (1 − q) quantile.
    ``stapo_random``        ablation: silence as many candidates as STAPO would, drawn uniformly.
    ``stapo_full_mask``     ablation (JustRL-FullMask): silence every candidate.
    ``top_entropy``         20-Entropy baseline: keep only the top ρ tokens by current-policy entropy.
"""

from __future__ import annotations

import copy

import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, register_policy_loss

from stapo_verl import state
from stapo_verl.state import KEEP_FIELD
from stapo_verl.config import MINIBATCH_STATS_SOURCES, StapoPolicyLossConfig
from stapo_verl.s2t import S2T_LOSS_MODES, s2t_keep_mask, top_entropy_keep_mask


class StapoLossError(RuntimeError):
    """Raised when a STAPO loss is called without what its configured route needs."""


def stapo_policy_loss_config(config) -> StapoPolicyLossConfig:
    """Return ``config.policy_loss`` if it is a :class:`StapoPolicyLossConfig`, else raise.

    Raises:
        StapoLossError: config is None or its ``policy_loss`` was built from verl's plain ``PolicyLossConfig``
            (the ``_target_`` override is missing).
    """
    pl = getattr(config, "policy_loss", None) if config is not None else None
    if not isinstance(pl, StapoPolicyLossConfig):
        raise StapoLossError(
            f"loss_mode={getattr(pl, 'loss_mode', None)!r} needs "
            "actor_rollout_ref.actor.policy_loss._target_=stapo_verl.config.StapoPolicyLossConfig "
            f"(got policy_loss of type {type(pl).__name__})"
        )
    return pl


def vanilla_on_kept(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    keep: torch.Tensor,
    loss_agg_mode: str,
    config,
    rollout_is_weights: torch.Tensor | None = None,
    batch_num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's vanilla PPO loss restricted to ``keep``, NaN-safe, graph always connected.

    Args:
        old_log_prob, log_prob, advantages: (bs, T) float.
        keep: (bs, T) bool, tokens that enter numerator and (token-mean) denominator.
        loss_agg_mode: verl aggregation mode. config: verl ``ActorConfig`` (its ``global_batch_info`` is copied,
            never mutated — verl refills it per micro-batch, bug D2).
        rollout_is_weights: (bs, T) or None.
        batch_num_tokens: replaces ``global_batch_info['batch_num_tokens']`` when given (token count of the
            whole mini-batch across DP that the kept tokens are normalised by).
    Returns:
        (loss 0-dim tensor attached to ``log_prob``'s graph, vanilla's metrics).
    Notes:
        Tokens with a non-finite log-prob/old log-prob/IS weight are dropped from ``keep``; inputs are replaced
        by ``torch.where`` (never multiplied by a mask) so NaN cannot reach the gradient (bug D6). A zero
        denominator is clamped to 1, so an all-masked batch yields a finite 0 loss with zero gradients.
    Source: ``verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla`` / ``agg_loss``.
    """
    keep = keep.bool() & finite_inputs(old_log_prob, log_prob, rollout_is_weights)
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    info = dict(getattr(config, "global_batch_info", {}) or {})
    if batch_num_tokens is not None:
        info["batch_num_tokens"] = batch_num_tokens
    if info.get("batch_num_tokens") is not None:
        info["batch_num_tokens"] = max(float(info["batch_num_tokens"]), 1.0)
    elif loss_agg_mode == "token-mean" and int(info.get("dp_size", 1) or 1) <= 1:
        info["batch_num_tokens"] = max(float(keep.sum()), 1.0)
    cfg = copy.copy(config)
    object.__setattr__(cfg, "global_batch_info", info)
    loss, metrics = compute_policy_loss_vanilla(
        old_log_prob=torch.where(keep, old_log_prob, zero),
        log_prob=torch.where(keep, log_prob, zero),
        advantages=torch.where(keep, advantages, zero),
        response_mask=keep,
        loss_agg_mode=loss_agg_mode,
        config=cfg,
        rollout_is_weights=None if rollout_is_weights is None else torch.where(keep, rollout_is_weights, zero),
    )
    return loss, metrics


def finite_inputs(old_log_prob, log_prob, rollout_is_weights=None) -> torch.Tensor:
    """(bs, T) bool: tokens whose log-prob, old log-prob and IS weight (if any) are all finite."""
    finite = torch.isfinite(log_prob.detach()) & torch.isfinite(old_log_prob)
    if rollout_is_weights is not None:
        finite = finite & torch.isfinite(rollout_is_weights)
    return finite


def _current_entropy(loss_mode: str) -> state.LossContext:
    ctx = state.LOSS_CONTEXT.get()
    if ctx is None or ctx.entropy is None:
        raise StapoLossError(
            f"loss_mode={loss_mode!r} with current-policy statistics needs the per-token entropy: set "
            "actor_rollout_ref.actor.calculate_entropy=True (the stapo_verl worker hook then hands it to the loss)"
        )
    return ctx


def _s2t_loss(loss_mode: str, **kw) -> tuple[torch.Tensor, dict[str, float]]:
    config = kw["config"]
    pl = stapo_policy_loss_config(config)
    if pl.stats_source in MINIBATCH_STATS_SOURCES:
        stats = state.MINIBATCH.stats
        if not state.MINIBATCH.active or stats is None:
            raise StapoLossError(
                f"loss_mode={loss_mode!r}, stats_source={pl.stats_source!r}: the S2T mask was not applied to this "
                "mini-batch. It is computed by stapo_verl's TrainingWorker.train_batch hook from the old-policy "
                "log-prob and entropy of verl's v1 trainer (trainer.use_v1=True, no rollout_correction.bypass_mode). "
                "Is the plugin loaded in this worker? For direct calls use "
                "stapo_verl.worker_hooks.apply_s2t_to_minibatch first."
            )
        ctx = state.LOSS_CONTEXT.get()
        if ctx is None:
            # Direct call (no engine, no hook wrapper): the caller passes K as response_mask.
            keep = kw["response_mask"].bool()
        elif ctx.keep is None:
            raise StapoLossError(
                f"loss_mode={loss_mode!r}: the micro-batch carries no {KEEP_FIELD!r} field; the worker hook writes "
                "it with the mask before engine.train_batch (stapo_verl.worker_hooks.apply_s2t_to_minibatch)"
            )
        else:
            keep = ctx.keep.bool() & kw["response_mask"].bool()
        # Exact renormalisation: the global Σ K of the whole mini-batch, fixed before the forward. A token whose
        # *current* log-prob is non-finite is dropped from the numerator (zero gradient) but stays in this
        # denominator (it weighs like a token with Â = 0); it is counted in nonfinite_tokens.
        batch_num_tokens = float(stats.n_keep)
        dropped = int((keep & ~finite_inputs(kw["old_log_prob"], kw["log_prob"], kw.get("rollout_is_weights"))).sum())
        state.MINIBATCH.nonfinite_current += dropped
    else:
        # current_micro_batch: current-policy p and H of this micro-batch, candidates gathered across DP.
        ctx = _current_entropy(loss_mode)
        mb = state.MINIBATCH
        mb.mask_calls += 1
        keep, stats = s2t_keep_mask(
            kw["log_prob"],
            ctx.entropy,
            kw["advantages"],
            kw["response_mask"],
            tau_p=pl.tau_p,
            q=pl.entropy_quantile,
            mode=S2T_LOSS_MODES[loss_mode],
            group=ctx.dp_group,
            seed=pl.random_mask_seed * 1_000_003 + mb.mask_calls,
        )
        # Running denominator: the engine counted every valid token of the mini-batch; subtract what was
        # silenced so far (this and earlier micro-batches). Later micro-batches' masks are unknown here.
        mb.removed_so_far += stats.n_masked + stats.n_nonfinite
        bnt = (config.global_batch_info or {}).get("batch_num_tokens")
        batch_num_tokens = None if bnt is None else float(bnt) - mb.removed_so_far
    loss, metrics = vanilla_on_kept(
        old_log_prob=kw["old_log_prob"],
        log_prob=kw["log_prob"],
        advantages=kw["advantages"],
        keep=keep,
        loss_agg_mode=kw["loss_agg_mode"],
        config=config,
        rollout_is_weights=kw.get("rollout_is_weights"),
        batch_num_tokens=batch_num_tokens,
    )
    metrics.update(stats.to_metrics())
    if pl.stats_source in MINIBATCH_STATS_SOURCES:
        # Global pre-forward count + this rank's current-policy drops so far (the worker hook replaces the
        # step metric by the exact global total after the micro-batch loop).
        metrics["actor/stapo/nonfinite_tokens"] = float(stats.n_nonfinite + state.MINIBATCH.nonfinite_current)
        metrics.update(state.MINIBATCH.extra_metrics)
    return loss, metrics


def _make_s2t_loss(loss_mode: str):
    def loss_fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode: str = "token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        return _s2t_loss(
            loss_mode,
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )

    loss_fn.__name__ = f"compute_policy_loss_{loss_mode}"
    loss_fn.__doc__ = (
        f"verl policy loss ``{loss_mode}`` (S2T mask mode ``{S2T_LOSS_MODES[loss_mode]}``); see :mod:`stapo_verl.losses`."
    )
    return loss_fn


compute_policy_loss_stapo = register_policy_loss("stapo")(_make_s2t_loss("stapo"))
compute_policy_loss_stapo_high_entropy = register_policy_loss("stapo_high_entropy")(
    _make_s2t_loss("stapo_high_entropy")
)
compute_policy_loss_stapo_random = register_policy_loss("stapo_random")(_make_s2t_loss("stapo_random"))
compute_policy_loss_stapo_full_mask = register_policy_loss("stapo_full_mask")(_make_s2t_loss("stapo_full_mask"))


@register_policy_loss("top_entropy")
def compute_policy_loss_top_entropy(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights=None,
):
    """20-Entropy ("Beyond the 80/20 rule"): policy gradient on the top ρ tokens by current-policy entropy.

    Selection: top ⌈ρ·N⌉ valid tokens of this micro-batch on this rank (official code semantics, spec A18).
    Normaliser (``top_entropy_normalizer``, token-mean only): ``kept`` → ρ × the global valid-token count of
    the mini-batch (the official code's kept-token mean; differs from the exact Σ⌈ρ·N_mb⌉ by < 1 token per
    micro-batch); ``all_tokens`` → the global valid-token count (the paper's 1/Σ|o_i| formula).
    Needs ``actor.calculate_entropy=True``. Shapes/return as in :mod:`stapo_verl.losses`.
    Raises:
        StapoLossError: no entropy reached the loss, or policy_loss is not a StapoPolicyLossConfig.
    """
    pl = stapo_policy_loss_config(config)
    ctx = _current_entropy("top_entropy")
    keep = top_entropy_keep_mask(ctx.entropy, response_mask, pl.top_entropy_ratio)
    bnt = (config.global_batch_info or {}).get("batch_num_tokens")
    if bnt is None:
        # Single process, no engine count: normalise over this micro-batch.
        n_valid = float(response_mask.sum())
        bnt = n_valid
    if pl.top_entropy_normalizer == "kept":
        bnt = float(bnt) * pl.top_entropy_ratio
    loss, metrics = vanilla_on_kept(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        keep=keep,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=rollout_is_weights,
        batch_num_tokens=float(bnt),
    )
    n_valid = max(int(response_mask.sum()), 1)
    metrics["actor/top_entropy/kept_frac"] = float(keep.sum()) / n_valid
    return loss, metrics
