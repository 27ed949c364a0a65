"""Worker-side plumbing: the S2T mask before the micro-batch loop, and entropy/keep mask into the loss.

verl 0.9.1 (``verl/workers/engine_workers.py``) trains one optimizer mini-batch per
``TrainingWorker.train_batch(data)`` call (inside ``train_mini_batch``), which hands ``data`` to
``engine.train_batch``; the FSDP and Megatron engines then compute ``batch_num_tokens = Σ loss_mask``
(all-reduced over DP) *before* the micro-batch loop and call ``loss_fn(model_output=..., data=..., dp_group=...)``
per micro-batch. This module wraps ``TrainingWorker.train_batch``, ``train_mini_batch`` and ``infer_batch`` (no
verl file is edited) so that, only when the actor's ``policy_loss`` is a
:class:`stapo_verl.config.StapoPolicyLossConfig`:

1. **mini-batch routes** (``stats_source=old_policy``, default, and ``current_minibatch``): the keep mask K is
   computed over the whole optimizer mini-batch, with the candidate population gathered over the DP group,
   before the micro-batch loop, and written into the data field :data:`stapo_verl.state.KEEP_FIELD` (response
   layout). ``loss_mask``/``response_mask`` stay intact, so verl's KL (``use_kl_loss``) and entropy terms see all
   valid tokens normalised by N_valid, exactly as vanilla verl; the PG term is normalised by the global Σ K
   (exact renormalisation, paper §3). ``old_policy`` takes p and H from ``old_log_probs``/``entropy`` (written by
   the v1 trainer's ``_compute_old_log_prob`` with ``calculate_entropy=True``): zero extra forwards.
   ``current_minibatch`` runs one no-grad forward of the mini-batch with the current policy through the
   engine's own ``infer_batch`` (``calculate_entropy=True``), except when no optimizer step happened since the
   old-log-prob pass (the first mini-batch of a step: π_θ = π_old, the old values are reused, identical); it
   logs ``actor/stapo/mask_disagreement`` (tokens whose keep decision differs from the old-policy mask).
2. **current-policy routes** (``stats_source=current_micro_batch``, ``top_entropy``): ``self.loss_fn`` is
   wrapped by :func:`stapo_ppo_loss`, which hands the *detached* per-token entropy verl computed in the training
   forward (``actor.calculate_entropy=True``; vocab-parallel under Megatron TP, computed before verl's in-place
   log-prob op) to the loss through :data:`stapo_verl.state.LOSS_CONTEXT`.
3. **token dump** (``dump_tokens=True``): :mod:`stapo_verl.token_dump` rows for the silenced tokens of the
   mini-batch plus as many kept candidates, one writer per DP rank.

Under Megatron the current-policy entropy is computed gradient-free before verl's in-place log-prob op
(:mod:`stapo_verl.megatron.entropy`). Wrappers are installed lazily when verl first imports
``verl.workers.engine_workers`` / the Megatron engine module (a post-import hook), so loading the plugin does
not import the worker stack (or megatron-core) in every process.
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import time

import torch

from stapo_verl import state, token_dump
from stapo_verl.config import MINIBATCH_STATS_SOURCES, StapoPolicyLossConfig, check_registered
from stapo_verl.dist_utils import all_reduce_sum
from stapo_verl.post_import import when_imported
from stapo_verl.s2t import S2T_LOSS_MODES, MaskStats, candidate_mask, s2t_keep_mask
from stapo_verl.state import KEEP_FIELD

logger = logging.getLogger(__name__)

_TARGET_MODULE = "verl.workers.engine_workers"
_MEGATRON_MODULE = "verl.workers.engine.megatron.transformer_impl"
_REQUIRED_FIELDS = ("old_log_probs", "entropy", "advantages", "response_mask")


class StapoDataError(KeyError):
    """Raised when a mini-batch lacks a field the old-policy S2T route needs."""


def _padded(t: torch.Tensor) -> torch.Tensor:
    """Nested (jagged) response tensor → (bs, T_max) float32, zeros in padding."""
    t = t.detach()
    if t.is_nested:
        return t.to(torch.float32).to_padded_tensor(0.0)
    return t.to(torch.float32)


def _check_fields(data) -> None:
    missing = [k for k in _REQUIRED_FIELDS if k not in set(data.keys())]
    if missing:
        raise StapoDataError(
            f"stats_source='old_policy'/'current_minibatch' need mini-batch fields {list(_REQUIRED_FIELDS)}; "
            f"missing {missing}. They come from verl's v1 trainer old-log-prob pass (trainer.use_v1=True, "
            "algorithm.rollout_correction.bypass_mode=False). Otherwise use "
            "++actor_rollout_ref.actor.policy_loss.stats_source=current_micro_batch with "
            "actor_rollout_ref.actor.calculate_entropy=True."
        )


def _mask(log_prob, entropy, advantages, valid, policy_loss, dp_group, seed):
    return s2t_keep_mask(
        log_prob,
        entropy,
        advantages,
        valid,
        tau_p=policy_loss.tau_p,
        q=policy_loss.entropy_quantile,
        mode=S2T_LOSS_MODES[policy_loss.loss_mode],
        group=dp_group,
        seed=seed,
    )


def apply_s2t_to_minibatch(
    data,
    policy_loss: StapoPolicyLossConfig,
    dp_group=None,
    *,
    log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    return_inputs: bool = False,
):
    """Compute K for one optimizer mini-batch (this rank's share) and write it into ``data[KEEP_FIELD]``.

    Args:
        data: verl TensorDict of the mini-batch with ``old_log_probs``, ``entropy``, ``advantages`` (response
            layout, nested/jagged or (bs, T)) and ``response_mask``. ``loss_mask``/``response_mask`` are not
            modified (the KL and entropy terms keep every valid token).
        policy_loss: the STAPO config (``tau_p``, ``entropy_quantile``, ``loss_mode``, ``random_mask_seed``).
        dp_group: DP group whose ranks together hold the mini-batch (``engine.get_data_parallel_group()``).
        log_prob, entropy: (bs, T) float32 statistics to use instead of the mini-batch's old-policy values
            (``stats_source=current_minibatch``: the current policy's, from :func:`current_policy_statistics`).
        return_inputs: also return the (bs, T) tensors the mask used (for the token dump / diagnostics).
    Returns:
        global :class:`MaskStats` of the mini-batch (identical on every DP rank); with ``return_inputs``,
        ``(stats, keep, log_prob, entropy, advantages, valid)``.
    Raises:
        StapoDataError: a required field is missing (e.g. legacy trainer or bypass mode).
    Source: spec §10 A3 (default route), verl_notes §5 design B; ``verl/workers/utils/padding.py``.
    """
    _check_fields(data)
    state.MINIBATCH.mask_calls += 1
    lp = _padded(data["old_log_probs"]) if log_prob is None else log_prob
    ent = _padded(data["entropy"]) if entropy is None else entropy
    adv = _padded(data["advantages"])
    valid = _padded(data["response_mask"]).bool()
    seed = policy_loss.random_mask_seed * 1_000_003 + state.MINIBATCH.mask_calls
    keep, stats = _mask(lp, ent, adv, valid, policy_loss, dp_group, seed)
    old = data["response_mask"]
    data[KEEP_FIELD] = _as_layout(keep, old)
    if return_inputs:
        return stats, keep, lp, ent, adv, valid
    return stats


def _as_layout(keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(bs, T) bool → the layout of ``like`` (nested/jagged response layout or padded), dtype of ``like``."""
    from verl.workers.utils.padding import response_to_nested

    if like.is_nested:
        return response_to_nested(keep.to(like.dtype), like)
    return keep.to(like.dtype)


def current_policy_statistics(engine, data, infer_keys: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One no-grad forward of the mini-batch with the current weights: (log p, H), each (bs, T) float32.

    Uses the engine's own inference path (``engine.infer_batch`` under ``engine.eval_mode``, with
    ``calculate_entropy=True`` and the mini-batch's ``temperature``), on a shallow copy of ``data`` so the
    training call sees its own keys. Output layout as ``no_padding_2_padding`` (what ``ppo_loss`` uses).

    Args:
        engine: verl ``BaseEngine`` (FSDP or Megatron). data: the mini-batch TensorDict (no-padding layout).
        infer_keys: engine keys for the forward (``micro_batch_size_per_gpu``, ``max_token_len_per_gpu``,
            ``use_dynamic_bsz``, ``use_remove_padding``, ``use_fused_kernels``), as ``TrainingWorker.infer_batch``
            injects them; keys already in ``data`` are overridden on the copy. Without ``use_dynamic_bsz`` the
            micro-batch size becomes ``gcd(len(data), micro_batch_size_per_gpu)`` (verl requires it to divide the
            mini-batch; same values, rows are independent).
    Raises:
        StapoDataError: Megatron with pipeline parallelism > 1 (only the last stage holds outputs; raised on every
            rank before the forward), or the engine returned no log-probs/entropy on this rank.
    Source: ``verl/workers/engine_workers.py::TrainingWorker.infer_batch``, ``verl/workers/engine/base.py``.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    if "megatron" in type(engine).__module__:
        from megatron.core import parallel_state as mpu

        if mpu.get_pipeline_model_parallel_world_size() > 1:  # same answer on every rank: all raise together
            raise StapoDataError(
                "stats_source='current_minibatch' with Megatron pipeline parallelism (pipeline_model_parallel_size="
                f"{mpu.get_pipeline_model_parallel_world_size()}) is not supported: only the last stage holds the "
                "inference outputs. Use stats_source=old_policy, or pipeline_model_parallel_size=1"
            )
    td = data.copy()
    for k in (KEEP_FIELD,):
        if k in td.keys():
            del td[k]
    keys = dict(infer_keys or {})
    if not keys.get("use_dynamic_bsz", True) and keys.get("micro_batch_size_per_gpu"):
        # verl's prepare_micro_batches asserts len(data) % micro_batch_size == 0; the inference micro-batch size
        # is tuned for the whole old-log-prob batch and need not divide a mini-batch (e.g. 16 vs 8 rows). Rows are
        # independent in this no-grad forward, so the largest common divisor gives the same values.
        keys["micro_batch_size_per_gpu"] = math.gcd(len(data), int(keys["micro_batch_size_per_gpu"]))
    tu.assign_non_tensor(td, calculate_entropy=True, compute_loss=False, **keys)
    with engine.eval_mode(disable_auto_offload=True):
        out = engine.infer_batch(td, loss_function=None)
    mo = (out or {}).get("model_output", {}) or {}
    if "log_probs" not in mo or "entropy" not in mo:
        raise StapoDataError(
            "stats_source='current_minibatch': the engine's inference forward returned no log_probs/entropy on "
            "this rank (pipeline stages other than the last hold no outputs); use stats_source=old_policy here"
        )
    dev = data["old_log_probs"].device if "old_log_probs" in data.keys() else None  # where the old values live
    lp = no_padding_2_padding(mo["log_probs"], data).detach().float().to(dev)
    ent = no_padding_2_padding(mo["entropy"], data).detach().float().to(dev)
    return lp, ent


def stapo_ppo_loss(model_output, data, dp_group=None, *, inner):
    """Wrap verl's ``ppo_loss`` partial: hand the detached entropy, the keep mask and the DP group to the loss.

    Args:
        model_output: engine output dict; ``entropy`` (nested, full sequence) present iff verl computed it.
        data: the micro-batch TensorDict (carries :data:`KEEP_FIELD` on the mini-batch routes).
        dp_group: DP group passed by the engine.
        inner: the worker's original loss function, ``partial(verl...ppo_loss, config=actor_config)``.
    Returns:
        whatever ``inner`` returns: (loss, metrics).
    Notes:
        When ``entropy_coeff == 0`` the entropy is removed from ``model_output`` before verl's ``ppo_loss``
        sees it, so no entropy term (and no entropy backward) enters the loss (bugs D19, D20).
    Source: ``verl/workers/utils/losses.py::ppo_loss``; ``no_padding_2_padding`` for the (bs, T) layout.
    """
    from verl.workers.utils.padding import no_padding_2_padding

    config = inner.keywords["config"]
    entropy = model_output.get("entropy", None)
    ent = None
    if entropy is not None:
        ent = no_padding_2_padding(entropy, data).detach().float()
        if float(getattr(config, "entropy_coeff", 0.0) or 0.0) == 0.0:
            model_output = {k: v for k, v in model_output.items() if k != "entropy"}
    keep = _padded(data[KEEP_FIELD]).bool() if KEEP_FIELD in data.keys() else None
    token = state.LOSS_CONTEXT.set(state.LossContext(entropy=ent, dp_group=dp_group, keep=keep))
    try:
        return inner(model_output=model_output, data=data, dp_group=dp_group)
    finally:
        state.LOSS_CONTEXT.reset(token)


def _stapo_actor_config(worker):
    loss_fn = getattr(worker, "loss_fn", None)
    config = getattr(loss_fn, "keywords", {}).get("config") if loss_fn is not None else None
    pl = getattr(config, "policy_loss", None)
    return config if isinstance(pl, StapoPolicyLossConfig) else None


def policy_is_old(worker) -> bool:
    """True iff no optimizer step ran on ``worker`` since its last old-log-prob pass (π_θ = π_old exactly).

    The wrapped ``TrainingWorker.train_batch`` counts optimizer steps (``_stapo_version``); the wrapped
    ``infer_batch`` records that count when it computes the actor's own log-probs (not the reference pass
    ``no_lora_adapter``). Before any old-log-prob pass was seen this is False (the forward is then run).
    """
    seen = getattr(worker, "_stapo_old_version", None)
    return seen is not None and seen == getattr(worker, "_stapo_version", 0)


def _infer_keys(worker) -> dict:
    # Same engine keys TrainingWorker.infer_batch injects (verl/workers/engine_workers.py).
    ec = worker.engine_config
    return dict(
        use_remove_padding=worker.model_config.get("use_remove_padding", False),
        use_dynamic_bsz=ec.use_dynamic_bsz,
        max_token_len_per_gpu=ec.infer_max_token_len_per_gpu,
        micro_batch_size_per_gpu=ec.infer_micro_batch_size_per_gpu,
        use_fused_kernels=ec.use_fused_kernels,
    )


def mask_minibatch(data, pl: StapoPolicyLossConfig, dp_group, *, current=None):
    """The mini-batch routes' mask: K into ``data[KEEP_FIELD]``; returns (stats, extra metrics, dump inputs).

    Args:
        data, pl, dp_group: as :func:`apply_s2t_to_minibatch`.
        current: ``None`` to use the old-policy values, or a zero-argument callable returning the current
            policy's (log p, H) (bs, T) — ``stats_source=current_minibatch`` on a mini-batch after an optimizer
            step. The old-policy mask is then computed too, as a diagnostic.
    Returns:
        (MaskStats, {metric: float}, (keep, log_prob, entropy, advantages, valid)).
    Metrics (``current_minibatch`` only): ``actor/stapo/mask_disagreement`` (valid tokens whose keep decision
    differs between the current-policy and the old-policy mask, global over DP), ``mask_disagreement_frac``
    (÷ valid tokens), ``current_stats`` (1 if this mini-batch used current-policy statistics, else 0; its step
    mean is the share of such mini-batches) and ``current_forward_s`` (seconds of the extra forward).
    """
    extra = {}
    if current is None:
        stats, keep, lp, ent, adv, valid = apply_s2t_to_minibatch(data, pl, dp_group, return_inputs=True)
        if pl.stats_source == "current_minibatch":
            extra = {"actor/stapo/mask_disagreement": 0.0, "actor/stapo/mask_disagreement_frac": 0.0,
                     "actor/stapo/current_stats": 0.0, "actor/stapo/current_forward_s": 0.0}
        return stats, extra, (keep, lp, ent, adv, valid)
    t0 = time.perf_counter()
    cur_lp, cur_ent = current()
    forward_s = time.perf_counter() - t0
    stats, keep, lp, ent, adv, valid = apply_s2t_to_minibatch(
        data, pl, dp_group, log_prob=cur_lp, entropy=cur_ent, return_inputs=True
    )
    # Diagnostic: the old-policy mask with the same seed (stapo_random draws the same permutation).
    seed = pl.random_mask_seed * 1_000_003 + state.MINIBATCH.mask_calls
    keep_old, _ = _mask(_padded(data["old_log_probs"]), _padded(data["entropy"]), adv, valid, pl, dp_group, seed)
    diff = all_reduce_sum(((keep ^ keep_old) & valid).sum().double().reshape(1), dp_group).cpu()
    n = float(diff[0])
    extra = {"actor/stapo/mask_disagreement": n, "actor/stapo/mask_disagreement_frac": n / max(stats.n_valid, 1),
             "actor/stapo/current_stats": 1.0, "actor/stapo/current_forward_s": forward_s}
    return stats, extra, (keep, lp, ent, adv, valid)


def _is_dump_writer(engine) -> bool:
    """One writer per DP rank: Megatron TP rank 0, CP rank 0, last PP stage; FSDP: Ulysses SP rank 0."""
    if "megatron" in type(engine).__module__:
        from megatron.core import parallel_state as mpu

        return (
            mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
            and mpu.get_pipeline_model_parallel_rank() == mpu.get_pipeline_model_parallel_world_size() - 1
        )
    return bool(engine.is_mp_src_rank_with_outputs())


def _tokenizer(worker):
    tok = getattr(worker, "_stapo_tokenizer", None)
    if tok is not None:
        return tok
    mc = getattr(worker, "model_config", None)
    tok = getattr(mc, "tokenizer", None)
    if tok is None:
        from transformers import AutoTokenizer

        path = getattr(mc, "local_tokenizer_path", None) or getattr(mc, "local_path", None) or getattr(mc, "path")
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
    worker._stapo_tokenizer = tok
    return tok


def dump_minibatch_tokens(data, pl, stats: MaskStats, inputs, *, tokenizer, dp_rank: int) -> int:
    """Append this rank's dump rows for one mini-batch (:mod:`stapo_verl.token_dump`); returns rows written.

    Silenced = candidates ∧ ¬K; kept contrast = candidates ∧ K, uniformly sampled, as many as silenced rows
    dumped; at most ``pl.dump_max_rows_per_step − rows already written this step`` rows (silenced first).
    The draw is seeded by (step, mini-batch, DP rank), so reruns dump the same rows.
    """
    keep, lp, ent, adv, valid = inputs
    st = state.STEP
    budget = pl.dump_max_rows_per_step - st.rows_dumped
    if budget <= 0:
        return 0
    cand, _ = candidate_mask(lp, ent, adv, valid, pl.tau_p)
    g = torch.Generator().manual_seed((st.global_step * 1_000_003 + st.minibatch) * 4099 + dp_rank)
    sil_idx, kept_idx = token_dump.select_rows(cand & ~keep, cand & keep, budget, g)
    if sil_idx.numel() == 0 and kept_idx.numel() == 0:
        return 0
    ctx = token_dump.DumpContext(step=st.global_step, minibatch=st.minibatch, dp_rank=dp_rank, tau_h=stats.tau_h,
                                 tau_p=pl.tau_p, loss_mode=pl.loss_mode, stats_source=pl.stats_source)
    rows = token_dump.build_rows(ctx, tokenizer, token_dump.response_id_getter(data, valid), lp, ent, adv,
                                 sil_idx, kept_idx)
    token_dump.append_jsonl(token_dump.dump_path(pl.dump_dir, dp_rank), rows)
    st.rows_dumped += len(rows)
    return len(rows)


def _fix_nonfinite_metric(output, total: float) -> None:
    """Replace ``actor/stapo/nonfinite_tokens`` in a ``train_batch`` output by the exact global ``total``.

    verl averages per-micro-batch policy-loss metrics (``Metric`` MEAN over micro-batches, then DP), which
    cannot sum counts that arise during the micro-batch loop; every value is set to the total instead.
    """
    if output is None:
        return
    from verl.utils import tensordict_utils as tu

    metrics = tu.get(output, "metrics", default=None)
    key = "actor/stapo/nonfinite_tokens"
    if not isinstance(metrics, dict) or key not in metrics:
        return
    vals = metrics[key] if isinstance(metrics[key], list) else [metrics[key]]
    for m in vals:
        if hasattr(m, "values"):
            m.values = [total] * len(m.values)
    if not isinstance(metrics[key], list) and not hasattr(metrics[key], "values"):
        metrics[key] = total


def wrap_train_batch(orig):
    """Return the ``TrainingWorker.train_batch`` replacement (see module docstring)."""

    @functools.wraps(orig)
    def train_batch(self, data):
        config = _stapo_actor_config(self)
        if config is None:
            return orig(self, data)
        pl = config.policy_loss
        check_registered(pl.loss_mode)  # worker-side self-check before every update
        dp_group = self.engine.get_data_parallel_group()
        stats, extra = None, {}
        minibatch_route = pl.loss_mode in S2T_LOSS_MODES and pl.stats_source in MINIBATCH_STATS_SOURCES
        if minibatch_route:
            current = None
            if pl.stats_source == "current_minibatch" and not policy_is_old(self):
                current = functools.partial(current_policy_statistics, self.engine, data, _infer_keys(self))
            stats, extra, inputs = mask_minibatch(data, pl, dp_group, current=current)
            if pl.dump_tokens and _is_dump_writer(self.engine):
                dump_minibatch_tokens(data, pl, stats, inputs, tokenizer=_tokenizer(self),
                                      dp_rank=self.engine.get_data_parallel_rank())
        state.MINIBATCH.start(stats, detached_entropy=not minibatch_route, extra_metrics=extra)
        inner = self.loss_fn
        self.loss_fn = functools.partial(stapo_ppo_loss, inner=inner)
        try:
            output = orig(self, data)
            if minibatch_route:
                local = torch.tensor([float(state.MINIBATCH.nonfinite_current)], dtype=torch.float64)
                dev = data["response_mask"].device
                total = float(all_reduce_sum(local.to(dev), dp_group).cpu()[0]) + stats.n_nonfinite
                _fix_nonfinite_metric(output, total)
            return output
        finally:
            self.loss_fn = inner
            state.MINIBATCH.end()
            self._stapo_version = getattr(self, "_stapo_version", 0) + 1  # an optimizer step ran
            state.STEP.minibatch += 1

    train_batch.__stapo_wrapped__ = True
    return train_batch


def _global_step(data, fallback: int) -> int:
    """verl's global step of the batch: ``global_steps`` (non-tensor, or the per-sample TransferQueue field
    written by ``agent_loop_tq``; its max), else ``fallback``."""
    from verl.utils import tensordict_utils as tu

    v = tu.get(data, "global_steps", default=None)
    if isinstance(v, torch.Tensor):
        return int(v.max()) if v.numel() else fallback
    if isinstance(v, list | tuple):
        nums = [int(x) for x in v if x is not None]
        return max(nums) if nums else fallback
    return fallback if v is None else int(v)


def wrap_train_mini_batch(orig):
    """``TrainingWorker.train_mini_batch`` replacement: sets :data:`stapo_verl.state.STEP` for the step."""

    @functools.wraps(orig)
    def train_mini_batch(self, data):
        if _stapo_actor_config(self) is not None:
            st = state.STEP
            st.update_calls += 1
            step = _global_step(data, st.update_calls)
            if step != st.global_step:
                st.rows_dumped = 0
            st.global_step, st.minibatch = step, 0
        return orig(self, data)

    train_mini_batch.__stapo_wrapped__ = True
    return train_mini_batch


def wrap_infer_batch(orig):
    """``TrainingWorker.infer_batch`` replacement: records the policy version of the old-log-prob pass."""

    @functools.wraps(orig)
    def infer_batch(self, data):
        from verl.utils import tensordict_utils as tu

        own_policy = not tu.get(data, key="no_lora_adapter", default=False)  # popped by orig: read it first
        out = orig(self, data)
        if own_policy and _stapo_actor_config(self) is not None:
            self._stapo_old_version = getattr(self, "_stapo_version", 0)
        return out

    infer_batch.__stapo_wrapped__ = True
    return infer_batch


def _patch_workers(module) -> None:
    cls = module.TrainingWorker
    for name, wrap in (("train_batch", wrap_train_batch), ("train_mini_batch", wrap_train_mini_batch),
                       ("infer_batch", wrap_infer_batch)):
        if not getattr(getattr(cls, name), "__stapo_wrapped__", False):
            setattr(cls, name, wrap(getattr(cls, name)))


def _patch_megatron(module) -> None:
    from stapo_verl.megatron.entropy import patch_megatron_engine

    patch_megatron_engine(module)


_PATCHES = {_TARGET_MODULE: _patch_workers, _MEGATRON_MODULE: _patch_megatron}


def install() -> None:
    """Install the wrappers now for verl modules already imported, else when verl first imports them."""
    for name, patch in _PATCHES.items():
        when_imported(name, patch)


def is_installed() -> bool:
    """True if ``TrainingWorker.train_batch`` is wrapped in this process (imports verl's worker module)."""
    mod = importlib.import_module(_TARGET_MODULE)
    return bool(getattr(mod.TrainingWorker.train_batch, "__stapo_wrapped__", False))
