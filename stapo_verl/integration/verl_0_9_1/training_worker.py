"""The plugin's worker-side options around the series' mask pre-pass (imported only by a job that asks for one:
:func:`stapo_verl.integration.verl_0_9_1.job.asks_for_extras`).

:class:`StapoPrepareBatch` is the actor's ``policy_token_mask_fn`` when the actor's ``policy_loss`` selects
``stats_source=current_minibatch``, the ``s2t_random`` mask (it reads the mini-batch index) or the diagnostics
(``mask_statistics``, ``dump_tokens``); otherwise the mask is the series' ``partial(apply_policy_token_mask,
actor_config)`` and nothing here is loaded (:mod:`.worker`). The ``train_batch`` dispatcher hands it the call
(:meth:`StapoPrepareBatch.around_train_batch`), which runs the series' method with, around it:

* the mini-batch index (``mini_batch_index``) and global step in the batch (:class:`MiniBatchCursor`);
* with ``mask_statistics``: the mask statistics (:mod:`stapo_verl.diagnostics.stats`; two tensor ``all_gather``
  calls over DP per mini-batch of their own) and the LM-head gradient norm (:mod:`.engine_grads`);
* with ``dump_tokens``: the silenced-token dump;
* when the driver asked for diagnostics (:data:`stapo_verl.diagnostics.shipping.REQUEST_KEY`), the update's payload
  on its last mini-batch (:class:`stapo_verl.diagnostics.shipping.DiagnosticsPayload`).

What verl would pass through ``train_mini_batch`` upstream (the mini-batch index within the step) is kept on the
worker instance in a :class:`MiniBatchCursor`: the index counts ``train_batch`` calls since the last mini-batch that
verl flagged ``update_lr_scheduler`` (the last of each ``train_mini_batch`` call), which is exactly
``train_mini_batch``'s loop index.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from stapo_verl.core import losses as core_losses
from stapo_verl.core.losses import POLICY_BATCH_NUM_TOKENS_KEY, POLICY_LOSS_MASK_KEY, apply_policy_token_mask
from stapo_verl.core.lab_masks import global_step_of
from stapo_verl.core.masks import S2T_FIELDS, S2T_TOKEN_MASKS
from stapo_verl.diagnostics.shipping import PAYLOAD_KEY, REQUEST_KEY, DiagnosticsPayload, gather_rows, table_rows
from stapo_verl.diagnostics.stats import MaskStatistics, is_vocab_size, mask_statistics
from stapo_verl.integration.verl_0_9_1.engine_grads import reading_lm_head_grad_norm
from stapo_verl.integration.verl_0_9_1.job import TokenMaskIntegrationError

#: worker output metric of the LM-head gradient norm (verl's driver keeps keys that already start with "actor/")
LM_HEAD_GRAD_NORM_KEY = "actor/stapo/lm_head_grad_norm"


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
    """The plugin's policy-token-mask pre-pass with its options: the actor's ``policy_token_mask_fn`` (set by the
    ``init_model`` dispatcher, :mod:`.worker`), or, passed as ``set_loss_fn(loss_fn, prepare_batch_fn=...)``, a
    pre-pass like any other.

    ``__call__(data, *, engine, dp_group) -> metrics`` runs the actor's ``policy_loss.token_mask`` on one optimizer
    mini-batch: on the old policy's statistics (:func:`stapo_verl.core.losses.apply_policy_token_mask`, no
    forward), or with ``stats_source=current_minibatch`` on those of one no-grad forward through ``engine``, whose
    log-probs and entropies it also writes under :data:`CURRENT_LOG_PROBS_KEY` / :data:`CURRENT_ENTROPY_KEY`
    (the statistics and the dump read them; :meth:`around_train_batch` takes them out before verl's body).

    Attributes:
        config: the actor's ``ActorConfig`` (verl's, the one ``ppo_loss`` is bound to).
        forward_keys: :func:`current_forward_keys` of the actor.
    """

    def __init__(self, config, forward_keys: dict):
        self.config, self.forward_keys = config, dict(forward_keys)

    @classmethod
    def for_worker(cls, config, worker) -> "StapoPrepareBatch":
        """The pre-pass of ``worker`` (a ``TrainingWorker``) for the actor config ``config``."""
        return cls(config, current_forward_keys(worker))

    def __call__(self, data, *, engine, dp_group=None) -> dict[str, float]:
        if self.config.policy_loss.stats_source != "current_minibatch":
            return apply_policy_token_mask(self.config, data, dp_group, engine)
        return _current_minibatch_mask(self.config, data, engine, self.forward_keys, dp_group)

    def around_train_batch(self, worker, data, train_batch):
        """``train_batch(worker, data)`` (the series' ``TrainingWorker.train_batch``) with the mini-batch index and
        the diagnostics around it (see the module docstring); returns its output with the diagnostics' metrics.

        Raises:
            TokenMaskIntegrationError: the worker's loss is not :func:`stapo_verl.core.losses.ppo_loss`.
        """
        config = self.config
        require_masked_loss(worker.loss_fn, config.policy_loss.token_mask)
        from verl.utils import tensordict_utils as tu

        cursor = worker.__dict__.setdefault("_stapo_cursor", MiniBatchCursor())
        step = global_step_of(tu.get(data, "global_steps")) if "global_steps" in data.keys() else 0
        index = cursor.enter(step)
        if "global_steps" not in data.keys():
            tu.assign_non_tensor(data, global_steps=step)
        tu.assign_non_tensor(data, mini_batch_index=index)
        last = bool(tu.get(data, "update_lr_scheduler", default=False))
        pl, lm_head = config.policy_loss, {}
        try:
            with reading_lm_head_grad_norm(worker.engine, lm_head) if pl.mask_statistics else nullcontext():
                output = train_batch(worker, data)
        finally:
            cursor.leave(last)

        # diagnostics of the mini-batch the mask ran on (the pre-pass wrote the mask into data)
        dp_group = worker.engine.get_data_parallel_group()
        is_output_rank = bool(worker.engine.is_mp_src_rank_with_outputs())
        s2t = pl.token_mask in S2T_TOKEN_MASKS
        statistics = s2t and is_output_rank and bool(pl.mask_statistics)  # the same on every rank of a DP group
        masked = _take_current(data)
        metrics = tu.get(output, "metrics") if output is not None else {}  # the pre-passes' joined them (τ_h)
        padded = _padded_fields(masked) if s2t and (statistics or pl.dump_tokens) else None
        if padded is not None:
            padded[POLICY_LOSS_MASK_KEY] = _padded(masked[POLICY_LOSS_MASK_KEY])
        extra = {}
        if statistics:
            stats = minibatch_statistics(config, padded, vocab_size_of(worker), dp_group)
            extra.update(stats.to_metrics())
            cursor.add_histograms(stats.histograms)
        # the driver's request (None: no diagnostics asked for, e.g. a trainer without the plugin's driver patch)
        request = tu.get(data, REQUEST_KEY, default=None)
        rows = _dump(worker, config, data, padded, metrics, step, index, cursor) if padded is not None else []
        if request is not None:
            cursor.rows.extend(rows)
        payload = None
        if last and request is not None and is_output_rank:
            payload = _payload(config, cursor, step, bool(request), dp_group, worker.engine.get_data_parallel_rank())
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
    masked ``ppo_loss`` (:func:`stapo_verl.core.losses.ppo_loss`).

    Raises:
        TokenMaskIntegrationError: another loss (distillation's, or a verl whose ``init_model`` no longer builds the
            loss from ``verl.workers.engine_workers.ppo_loss``): the mask ``token_mask`` would not be applied.
    """
    if getattr(loss_fn, "func", None) is not core_losses.ppo_loss:
        raise TokenMaskIntegrationError(
            f"actor.policy_loss.token_mask={token_mask!r} is set, but the actor's loss function is "
            f"{getattr(loss_fn, 'func', loss_fn)!r}, not stapo_verl.core.losses.ppo_loss (distillation, or a verl "
            "whose ActorRolloutRefWorker.init_model no longer builds the loss from "
            "verl.workers.engine_workers.ppo_loss); the mask would not be applied"
        )


