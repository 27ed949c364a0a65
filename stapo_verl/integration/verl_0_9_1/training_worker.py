"""Worker-side patches of ``verl.workers.engine_workers`` (ledger: :data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

The series' worker methods are :mod:`stapo_verl.core.engine_workers` (one source: ``upstream/build_series.py`` copies
them into verl's classes). This module installs them on verl 0.9.1, each behind a dispatcher that hands a worker
without a pre-pass verl's own method, its arguments and its result:

* ``TrainingWorker.set_loss_fn(loss_fn, prepare_batch_fn=None)`` and ``ActorRolloutRefWorker.set_loss_fn`` (the same
  signature): the series' methods once a pre-pass is set;
* ``ActorRolloutRefWorker.init_model``: after verl's body, when the actor's ``policy_loss`` asks for a mask
  (:func:`stapo_verl.integration.verl_0_9_1.job.asks_for_mask`), the actor's ``policy_token_mask_fn`` is a
  :class:`StapoPrepareBatch` (the series sets ``partial(apply_policy_token_mask, actor_config)``; this one also
  runs ``stats_source=current_minibatch``);
* ``TrainingWorker.train_batch``: the series' method when the worker has a pre-pass (it runs the caller's
  ``prepare_batch_fn``, then the mask, inside the engine's train mode); with the plugin's mask, the diagnostics
  around it: the mask statistics (:mod:`stapo_verl.diagnostics.stats`; two tensor ``all_gather`` calls over DP per
  mini-batch of their own, none with ``mask_statistics=False``), the silenced-token dump (``dump_tokens``), the
  LM-head gradient norm (:mod:`.engine_grads`) and, when the driver asked for diagnostics
  (:data:`stapo_verl.diagnostics.shipping.REQUEST_KEY`), the update's payload on its last mini-batch
  (:class:`stapo_verl.diagnostics.shipping.DiagnosticsPayload`);
* ``ppo_loss`` (the name ``init_model`` builds the actor's loss from) is rebound to :func:`wrap_ppo_loss`'s
  dispatcher: :func:`stapo_verl.core.losses.ppo_loss` (verl's function plus the mask on the policy-gradient term)
  when the actor config asks for a mask, verl's own ``ppo_loss`` otherwise.

What verl would pass through ``train_mini_batch`` upstream (the mini-batch index within the step) is kept on the
worker instance in a :class:`MiniBatchCursor`: the index counts ``train_batch`` calls since the last mini-batch that
verl flagged ``update_lr_scheduler`` (the last of each ``train_mini_batch`` call), which is exactly
``train_mini_batch``'s loop index.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from stapo_verl.core import engine_workers as series
from stapo_verl.core import losses as core_losses
from stapo_verl.core.losses import POLICY_BATCH_NUM_TOKENS_KEY, POLICY_LOSS_MASK_KEY, apply_policy_token_mask
from stapo_verl.core.masks import S2T_FIELDS, S2T_TOKEN_MASKS, global_step_of
from stapo_verl.diagnostics.shipping import PAYLOAD_KEY, REQUEST_KEY, DiagnosticsPayload, gather_rows, table_rows
from stapo_verl.diagnostics.stats import MaskStatistics, is_vocab_size, mask_statistics
from stapo_verl.integration.verl_0_9_1.engine_grads import reading_lm_head_grad_norm
from stapo_verl.integration.verl_0_9_1.job import asks_for_mask, record_acted

#: worker output metric of the LM-head gradient norm (verl's driver keeps keys that already start with "actor/")
LM_HEAD_GRAD_NORM_KEY = "actor/stapo/lm_head_grad_norm"

_MARK = "__stapo_integration__"
_PREFIX = "verl.workers.engine_workers."


class TokenMaskIntegrationError(RuntimeError):
    """A token mask is configured, but this worker cannot apply it (e.g. its loss is not the masked ppo_loss)."""


@dataclass
class MiniBatchCursor:
    """Where a worker is within verl's update: the mini-batch index in the step, the dump rows of the step, and the
    diagnostics the update has collected so far.

    Attributes:
        index: the index the next ``train_batch`` call gets (0-based; counts over ``ppo_epochs``).
        step: the global step of the last mini-batch (None before the first).
        rows_dumped: token-dump rows selected for ``step`` on this rank.
        histograms: the update's mask histograms so far (global over DP), summed over its mini-batches.
        rows: this rank's token rows of the update, kept when the driver asks for diagnostics (it writes the dump).
    """

    index: int = 0
    step: int | None = None
    rows_dumped: int = 0
    histograms: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)

    def add_histograms(self, histograms: dict) -> None:
        """Sum one mini-batch's histograms into the update's."""
        for name, h in histograms.items():
            self.histograms[name] = self.histograms[name].merge(h) if name in self.histograms else h

    def take_update(self) -> tuple[dict, list]:
        """The update's histograms and rows; clears both for the next update."""
        out = (self.histograms, self.rows)
        self.histograms, self.rows = {}, []
        return out

    def enter(self, step: int) -> int:
        """Start a mini-batch of ``step``; returns its index."""
        if step != self.step:
            self.step, self.rows_dumped = step, 0
            self.take_update()  # a new step starts a new update (drops what an interrupted one left)
        return self.index

    def leave(self, last_of_update: bool) -> None:
        """Finish the mini-batch; the index restarts after the last mini-batch of an update."""
        self.index = 0 if last_of_update else self.index + 1


#: batch fields the current-policy pre-pass writes beside the mask: the statistics the mask read (response layout)
CURRENT_LOG_PROBS_KEY = "stapo_current_log_probs"
CURRENT_ENTROPY_KEY = "stapo_current_entropy"


class StapoPrepareBatch:
    """The plugin's policy-token-mask pre-pass: the actor's ``policy_token_mask_fn`` (set by the ``init_model``
    hook; the upstream series' contract, :mod:`stapo_verl.core.engine_workers`), or, passed as
    ``set_loss_fn(loss_fn, prepare_batch_fn=...)``, a pre-pass like any other.

    ``__call__(data, *, engine, dp_group) -> metrics`` runs the actor's ``policy_loss.token_mask`` on one optimizer
    mini-batch: on the old policy's statistics (:func:`stapo_verl.core.losses.apply_policy_token_mask`, no
    forward), or with ``stats_source=current_minibatch`` on those of one no-grad forward through ``engine``, whose
    log-probs and entropies it also writes under :data:`CURRENT_LOG_PROBS_KEY` / :data:`CURRENT_ENTROPY_KEY`
    (the statistics and the dump read them; the ``train_batch`` wrapper takes them out before verl's body).

    Attributes:
        config: the actor's ``ActorConfig`` (built by ``ActorRolloutRefWorker.init_model``'s hook from the worker's
            own config, as verl builds the one ``ppo_loss`` is bound to). forward_keys: :func:`current_forward_keys` of the actor.
    """

    def __init__(self, config, forward_keys: dict):
        self.config, self.forward_keys = config, dict(forward_keys)

    def __call__(self, data, *, engine, dp_group=None) -> dict[str, float]:
        if self.config.policy_loss.stats_source != "current_minibatch":
            return apply_policy_token_mask(self.config, data, dp_group, engine)
        return _current_minibatch_mask(self.config, data, engine, self.forward_keys, dp_group)


def current_forward_keys(worker) -> dict:
    """The engine keys of the ``stats_source=current_minibatch`` forward: the keys ``TrainingWorker.infer_batch``
    injects (verl ``verl.workers.engine_workers``), at the *training* token budget and micro-batch size.

    The forward runs inside ``train_batch``, with the parameters, main gradients and optimizer shard on the GPU, so
    it gets the update's budget (``engine_config.max_token_len_per_gpu`` = ``actor.ppo_max_token_len_per_gpu``), not
    the no-grad log-prob pass's (``infer_max_token_len_per_gpu`` = ``rollout.log_prob_max_token_len_per_gpu``, which
    only the parameters share the GPU with). :func:`stapo_verl.launch.memory_plan.current_forward_tokens` is the same
    rule read from the config (the memory plan's phase).
    """
    ec = worker.engine_config
    return dict(
        use_remove_padding=worker.model_config.get("use_remove_padding", False),
        use_dynamic_bsz=ec.use_dynamic_bsz,
        max_token_len_per_gpu=ec.max_token_len_per_gpu,
        micro_batch_size_per_gpu=ec.micro_batch_size_per_gpu,
        use_fused_kernels=ec.use_fused_kernels,
    )


def _padded(value: torch.Tensor) -> torch.Tensor:
    return value.to_padded_tensor(0) if value.is_nested else value


def _current_minibatch_mask(config, data, engine, forward_keys, dp_group) -> dict[str, float]:
    """The mask from the current policy's log-prob and entropy (one forward through ``engine``); with
    ``mask_statistics``, also the old-policy mask, for a diagnostic. Writes the mask into ``data`` and the current
    statistics under :data:`CURRENT_LOG_PROBS_KEY` / :data:`CURRENT_ENTROPY_KEY`; returns the metrics."""
    from verl.utils import tensordict_utils as tu

    from stapo_verl.minibatch.current_policy import as_response_layout, current_policy_statistics

    log_prob, entropy, seconds = current_policy_statistics(engine, data, forward_keys)
    current = data.copy()
    current["old_log_probs"] = as_response_layout(log_prob, data["old_log_probs"])
    current["entropy"] = as_response_layout(entropy, data["entropy"])
    metrics = apply_policy_token_mask(config, current, dp_group, engine)
    if config.policy_loss.mask_statistics:
        metrics.update(_mask_disagreement(config, data, current, dp_group))
    metrics["actor/stapo/current_forward_s"] = seconds
    data[POLICY_LOSS_MASK_KEY] = current[POLICY_LOSS_MASK_KEY]
    data[CURRENT_LOG_PROBS_KEY], data[CURRENT_ENTROPY_KEY] = current["old_log_probs"], current["entropy"]
    tu.assign_non_tensor(data, **{POLICY_BATCH_NUM_TOKENS_KEY: tu.get(current, POLICY_BATCH_NUM_TOKENS_KEY)})
    return metrics


def _take_current(data):
    """The mini-batch as the mask read it: ``data`` itself on the old-policy route, else a copy with the current
    statistics (taken out of ``data``) under the old-policy names."""
    if CURRENT_LOG_PROBS_KEY not in data.keys():
        return data
    masked = data.copy()
    masked["old_log_probs"], masked["entropy"] = data.pop(CURRENT_LOG_PROBS_KEY), data.pop(CURRENT_ENTROPY_KEY)
    return masked


def _mask_disagreement(config, data, current, dp_group) -> dict[str, float]:
    """How many valid tokens the old-policy mask decides otherwise than the current one (``current``), over the DP
    group; runs the mask once more (with its own exchange)."""
    old = data.copy()
    apply_policy_token_mask(config, old, dp_group)
    valid = _padded(data["response_mask"]).bool()
    differ = ((_padded(current[POLICY_LOSS_MASK_KEY]) != _padded(old[POLICY_LOSS_MASK_KEY])) & valid).sum()
    counts = torch.stack([differ, valid.sum()]).double()
    import torch.distributed as dist

    if dp_group is not None and dist.is_initialized() and dist.get_world_size(dp_group) > 1:
        dist.all_reduce(counts, group=dp_group)  # the disagreement over the whole mini-batch
    counts = counts.cpu()
    return {
        "actor/stapo/mask_disagreement": float(counts[0]),
        "actor/stapo/mask_disagreement_frac": float(counts[0]) / max(float(counts[1]), 1.0),
    }


def _is_dump_writer(engine) -> bool:
    """One writer per DP rank: Megatron TP rank 0, CP rank 0, last PP stage; FSDP: the rank with outputs."""
    if "megatron" in type(engine).__module__:
        from megatron.core import parallel_state as mpu

        return (
            mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
            and mpu.get_pipeline_model_parallel_rank() == mpu.get_pipeline_model_parallel_world_size() - 1
        )
    return bool(engine.is_mp_src_rank_with_outputs())


def _tokenizer(worker):
    tok = getattr(getattr(worker, "model_config", None), "tokenizer", None)
    if tok is None:
        tok = getattr(worker, "_stapo_tokenizer", None)
    if tok is None:
        from transformers import AutoTokenizer

        mc = worker.model_config
        path = getattr(mc, "local_tokenizer_path", None) or getattr(mc, "local_path", None) or mc.path
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
        worker._stapo_tokenizer = tok
    return tok


def _padded_fields(masked) -> dict:
    """The fields the mask reads and, when the mini-batch has them, the rollout-correction weights of the PG term,
    padded once for the statistics and the dump: (bs, T) tensors in verl's response layout (the caller adds the
    mask's keep, ``POLICY_LOSS_MASK_KEY``, once the mask ran)."""
    keys = S2T_FIELDS
    if "rollout_is_weights" in masked.keys():
        keys = (*keys, "rollout_is_weights")
    return {key: _padded(masked[key]) for key in keys}


def vocab_size_of(worker) -> int | None:
    """|V| of the worker's model: the width of its logits, ``vocab_size`` of the (text) config of verl's
    ``HFModelConfig.hf_config`` (the LM head's output size of a Hugging Face causal LM; Qwen3: 151,936, more than
    its tokenizer's entries, and the softmax runs over all of them). None when the worker has no such config or it
    is not a usable |V| (:func:`stapo_verl.diagnostics.stats.is_vocab_size`)."""
    hf_config = getattr(getattr(worker, "model_config", None), "hf_config", None)
    if hf_config is None:
        return None
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    size = getattr(text, "vocab_size", None)
    return int(size) if is_vocab_size(size) else None


def _dump(worker, config, data, padded, metrics, step, index, cursor) -> list[dict]:
    """The mini-batch's token rows (``dump_tokens``), selected on this rank and written by the driver (they travel
    in the update's payload: :mod:`stapo_verl.diagnostics.shipping`); returns the rows.
    ``padded``: :func:`_padded_fields` of the mini-batch the mask ran on."""
    from stapo_verl.minibatch.token_dump import minibatch_token_rows

    pl = config.policy_loss
    if not (pl.dump_tokens and _is_dump_writer(worker.engine)):
        return []
    batch = {key: padded[key] for key in S2T_FIELDS}
    rows = minibatch_token_rows(
        data, batch, padded[POLICY_LOSS_MASK_KEY], config=config, step=step, minibatch=index,
        dp_rank=worker.engine.get_data_parallel_rank(), tokenizer=_tokenizer(worker),
        budget=pl.dump_max_rows_per_step - cursor.rows_dumped, tau_h=metrics.get("actor/stapo/tau_h"),
    )
    cursor.rows_dumped += len(rows)
    return rows


def minibatch_statistics(config, padded: dict, vocab_size: int | None, dp_group) -> MaskStatistics:
    """The mask statistics of the mini-batch over the DP group (``padded``: :func:`_padded_fields` of the fields the
    mask read, with its keep under ``POLICY_LOSS_MASK_KEY``); the PG weights of the silenced-gradient share follow
    the actor's ``loss_agg_mode`` and rollout-correction weights, |V| is the model's (:func:`vocab_size_of`). One
    exchange over ``dp_group`` (two tensor ``all_gather`` calls on its device), on every rank of it."""
    import torch.distributed as dist
    from verl.utils.device import get_device_id

    distributed = dp_group is not None and dist.is_initialized() and dist.get_world_size(dp_group) > 1
    return mask_statistics(padded["old_log_probs"], padded["entropy"], padded["advantages"], padded["response_mask"],
                           padded[POLICY_LOSS_MASK_KEY], tau_p=config.policy_loss.s2t_tau_p, group=dp_group,
                           vocab_size=vocab_size, loss_agg_mode=config.loss_agg_mode,
                           rollout_is_weights=padded.get("rollout_is_weights"),
                           device=get_device_id() if distributed else None)


def _payload(config, cursor, step, table_due, dp_group, dp_rank) -> DiagnosticsPayload:
    """The update's payload (see :mod:`stapo_verl.diagnostics.shipping`): the histograms, every DP rank's token-dump
    rows (``dump_tokens``; every output rank of the DP group calls this with the same config and ``table_due``) and,
    when due, the table."""
    histograms, rows = cursor.take_update()
    if not config.policy_loss.dump_tokens:
        return DiagnosticsPayload(step=step, histograms=histograms)
    dump = gather_rows(rows, dp_group, dp_rank=dp_rank)
    if not table_due:
        return DiagnosticsPayload(step=step, histograms=histograms, dump=dump)
    table, selected = table_rows(dump, max_rows=config.policy_loss.table_max_rows, seed=step)
    return DiagnosticsPayload(step=step, histograms=histograms, rows=table, rows_selected=selected, dump=dump)


def require_masked_loss(loss_fn, token_mask: str) -> None:
    """Raise unless ``loss_fn`` (a ``functools.partial``, as ``ActorRolloutRefWorker.init_model`` builds it) is the
    masked ``ppo_loss`` (the plugin's, or :func:`wrap_ppo_loss`'s dispatcher).

    Raises:
        TokenMaskIntegrationError: another loss (distillation's, or a verl whose ``init_model`` no longer builds the
            loss from ``verl.workers.engine_workers.ppo_loss``): the mask ``token_mask`` would not be applied.
    """
    loss = getattr(loss_fn, "func", None)
    if loss is not core_losses.ppo_loss and not getattr(loss, _MARK, False):
        raise TokenMaskIntegrationError(
            f"actor.policy_loss.token_mask={token_mask!r} is set, but the actor's loss function is "
            f"{getattr(loss_fn, 'func', loss_fn)!r}, not stapo_verl.core.losses.ppo_loss (distillation, or a verl "
            "whose ActorRolloutRefWorker.init_model no longer builds the loss from "
            "verl.workers.engine_workers.ppo_loss); the mask would not be applied"
        )


def _pre_passes(worker) -> tuple:
    """The worker's ``(prepare_batch_fn, policy_token_mask_fn)`` as the series' ``TrainingWorker`` holds them (None
    where unset)."""
    return worker.__dict__.get("prepare_batch_fn"), worker.__dict__.get("policy_token_mask_fn")


def _stapo_pre_pass(worker) -> StapoPrepareBatch | None:
    """The plugin's mask pre-pass among the worker's pre-passes (the mask slot first), or None."""
    for fn in reversed(_pre_passes(worker)):
        if isinstance(fn, StapoPrepareBatch):
            return fn
    return None


def wrap_train_batch(orig):
    """The ``TrainingWorker.train_batch`` replacement: verl's method for a worker without a pre-pass; the series'
    (:meth:`stapo_verl.core.engine_workers.TrainingWorker.train_batch`) with one, and with the plugin's mask the
    diagnostics around it (see the module docstring)."""

    @functools.wraps(orig)
    def train_batch(self, data):
        if not any(_pre_passes(self)):
            return orig(self, data)
        record_acted(_PREFIX + "TrainingWorker.train_batch")
        self.__dict__.setdefault("prepare_batch_fn", None)  # the series' __init__ sets both
        self.__dict__.setdefault("policy_token_mask_fn", None)
        prepare = _stapo_pre_pass(self)
        if prepare is None:  # only another pre-pass (a user's): the series' method, nothing of the plugin's
            return series.TrainingWorker.train_batch(self, data)
        config = prepare.config
        require_masked_loss(self.loss_fn, config.policy_loss.token_mask)
        from verl.utils import tensordict_utils as tu

        cursor = self.__dict__.setdefault("_stapo_cursor", MiniBatchCursor())
        step = global_step_of(tu.get(data, "global_steps")) if "global_steps" in data.keys() else 0
        index = cursor.enter(step)
        if "global_steps" not in data.keys():
            tu.assign_non_tensor(data, global_steps=step)
        tu.assign_non_tensor(data, mini_batch_index=index)
        last = bool(tu.get(data, "update_lr_scheduler", default=False))
        try:
            with reading_lm_head_grad_norm(self.engine, {}) as lm_head:
                output = series.TrainingWorker.train_batch(self, data)
        finally:
            cursor.leave(last)

        # diagnostics of the mini-batch the mask ran on (the pre-pass wrote the mask into data)
        dp_group = self.engine.get_data_parallel_group()
        pl = config.policy_loss
        is_output_rank = bool(self.engine.is_mp_src_rank_with_outputs())
        s2t = pl.token_mask in S2T_TOKEN_MASKS
        statistics = s2t and is_output_rank and bool(pl.mask_statistics)  # the same on every rank of a DP group
        masked = _take_current(data)
        metrics = tu.get(output, "metrics") if output is not None else {}  # the pre-passes' joined them (τ_h)
        padded = _padded_fields(masked) if s2t and (statistics or pl.dump_tokens) else None
        if padded is not None:
            padded[POLICY_LOSS_MASK_KEY] = _padded(masked[POLICY_LOSS_MASK_KEY])
        extra = {}
        if statistics:
            stats = minibatch_statistics(config, padded, vocab_size_of(self), dp_group)
            extra.update(stats.to_metrics())
            cursor.add_histograms(stats.histograms)
        # the driver's request (None: no diagnostics asked for, e.g. a trainer without the plugin's driver patch)
        request = tu.get(data, REQUEST_KEY, default=None)
        rows = _dump(self, config, data, padded, metrics, step, index, cursor) if padded is not None else []
        if request is not None:
            cursor.rows.extend(rows)
        payload = None
        if last and request is not None and is_output_rank:
            payload = _payload(config, cursor, step, bool(request), dp_group, self.engine.get_data_parallel_rank())
        elif last:
            cursor.take_update()
        if output is not None:
            output_metrics = tu.get(output, "metrics")
            output_metrics.update(extra)
            if lm_head.get("norm") is not None:
                output_metrics[LM_HEAD_GRAD_NORM_KEY] = lm_head["norm"]
            if payload is not None:
                output_metrics[PAYLOAD_KEY] = payload
            tu.assign_non_tensor(output, metrics=output_metrics)
        return output

    setattr(train_batch, _MARK, True)
    return train_batch


def wrap_ppo_loss(orig):
    """The function ``verl.workers.engine_workers.ppo_loss`` is rebound to: with the actor config's
    ``policy_loss.token_mask`` set, :func:`stapo_verl.core.losses.ppo_loss` (verl 0.9.1's ``ppo_loss`` plus the mask
    on the policy-gradient term); otherwise ``orig`` (verl's ``verl.workers.utils.losses.ppo_loss``) with the
    caller's own arguments, and its result untouched.

    Args:
        orig: verl's ``ppo_loss(config, model_output, data, dp_group=None)``; ``ActorRolloutRefWorker.init_model``
            binds ``config`` (the ``ActorConfig``) with ``functools.partial``.
    """

    @functools.wraps(orig)
    def ppo_loss(*args, **kwargs):
        config = kwargs["config"] if "config" in kwargs else args[0]
        if not asks_for_mask(config.policy_loss):
            return orig(*args, **kwargs)
        record_acted(_PREFIX + "ppo_loss")
        return core_losses.ppo_loss(*args, **kwargs)

    setattr(ppo_loss, _MARK, True)
    return ppo_loss


def replace_set_loss_fn(orig):
    """``TrainingWorker.set_loss_fn`` as the upstream series shapes it
    (:meth:`stapo_verl.core.engine_workers.TrainingWorker.set_loss_fn`), keeping ``orig``'s name and verl's
    ``@register`` dispatch attributes; verl's own method while no pre-pass is set or passed."""

    @functools.wraps(orig)
    def set_loss_fn(self, loss_fn, prepare_batch_fn=None):
        if prepare_batch_fn is None and "prepare_batch_fn" not in self.__dict__:
            return orig(self, loss_fn)
        record_acted(_PREFIX + "TrainingWorker.set_loss_fn")
        return series.TrainingWorker.set_loss_fn(self, loss_fn, prepare_batch_fn=prepare_batch_fn)

    setattr(set_loss_fn, _MARK, True)
    return set_loss_fn


def replace_actor_set_loss_fn(orig):
    """``ActorRolloutRefWorker.set_loss_fn(loss_fn, prepare_batch_fn=None)`` as the upstream series shapes it
    (:meth:`stapo_verl.core.engine_workers.ActorRolloutRefWorker.set_loss_fn`: the actor's policy token mask stays);
    verl's own method while no pre-pass is set or passed."""

    @functools.wraps(orig)
    def set_loss_fn(self, loss_fn, prepare_batch_fn=None):
        if prepare_batch_fn is None and "prepare_batch_fn" not in self.actor.__dict__:
            return orig(self, loss_fn)
        record_acted(_PREFIX + "ActorRolloutRefWorker.set_loss_fn")
        return series.ActorRolloutRefWorker.set_loss_fn(self, loss_fn, prepare_batch_fn=prepare_batch_fn)

    setattr(set_loss_fn, _MARK, True)
    return set_loss_fn


def wrap_init_model(orig):
    """``ActorRolloutRefWorker.init_model`` wrapper: once verl built the actor, set its ``policy_token_mask_fn`` when
    the actor's ``policy_loss`` asks for a mask (the series' ``init_model`` sets
    ``partial(apply_policy_token_mask, actor_config)``); the actor config is built from the worker's own config as
    verl builds it (``omega_conf_to_dataclass``).

    Raises:
        TokenMaskIntegrationError: a token mask with a loss that is not the plugin's ``ppo_loss`` (distillation).
    """

    @functools.wraps(orig)
    def init_model(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        actor = self.__dict__.get("actor")
        policy_loss = self.config.actor.get("policy_loss", None)
        if actor is None or policy_loss is None or not asks_for_mask(policy_loss):
            return out
        from verl.utils.config import omega_conf_to_dataclass

        config = omega_conf_to_dataclass(self.config.actor)
        config.model_config = actor.model_config
        require_masked_loss(self.loss_fn, config.policy_loss.token_mask)
        record_acted(_PREFIX + "ActorRolloutRefWorker.init_model")
        actor.policy_token_mask_fn = StapoPrepareBatch(config, current_forward_keys(actor))
        return out

    setattr(init_model, _MARK, True)
    return init_model


def patch_engine_workers(module) -> None:
    """Post-import hook of ``verl.workers.engine_workers``: rebind ``ppo_loss`` to :func:`wrap_ppo_loss`'s
    dispatcher; install the series' ``TrainingWorker.set_loss_fn`` / ``train_batch`` and
    ``ActorRolloutRefWorker.set_loss_fn`` behind their dispatchers; ``ActorRolloutRefWorker.init_model`` sets the
    actor's mask (idempotent)."""
    if not getattr(module.ppo_loss, _MARK, False):
        module.ppo_loss = wrap_ppo_loss(module.ppo_loss)
    cls = module.TrainingWorker
    if not getattr(cls.train_batch, _MARK, False):
        cls.train_batch = wrap_train_batch(cls.train_batch)
    if not getattr(cls.set_loss_fn, _MARK, False):
        cls.set_loss_fn = replace_set_loss_fn(cls.set_loss_fn)
    arr = module.ActorRolloutRefWorker
    if not getattr(arr.init_model, _MARK, False):
        arr.init_model = wrap_init_model(arr.init_model)
    if not getattr(arr.set_loss_fn, _MARK, False):
        arr.set_loss_fn = replace_actor_set_loss_fn(arr.set_loss_fn)


def is_installed() -> bool:
    """True if this process's ``verl.workers.engine_workers`` carries the patches (imports that module)."""
    import verl.workers.engine_workers as engine_workers

    return getattr(engine_workers.ppo_loss, _MARK, False) and all(
        getattr(method, _MARK, False)
        for method in (engine_workers.TrainingWorker.train_batch, engine_workers.TrainingWorker.set_loss_fn,
                       engine_workers.ActorRolloutRefWorker.init_model,
                       engine_workers.ActorRolloutRefWorker.set_loss_fn)
    )
