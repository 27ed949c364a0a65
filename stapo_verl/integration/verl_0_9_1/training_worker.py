"""Worker-side patches of ``verl.workers.engine_workers`` (ledger: :data:`stapo_verl.integration.verl_0_9_1.PATCHES`).

* ``ppo_loss`` (the name ``ActorRolloutRefWorker.init_model`` builds the actor's loss from) is rebound to
  :func:`wrap_ppo_loss`'s dispatcher: :func:`stapo_verl.core.losses.ppo_loss` (verl's function plus the mask on the
  policy-gradient term) when the actor config selects a token mask, verl's own ``ppo_loss`` otherwise.
* ``TrainingWorker.train_batch`` (one optimizer mini-batch) is wrapped: when the actor's ``policy_loss.token_mask``
  is set, :func:`stapo_verl.core.losses.apply_policy_token_mask` runs on the mini-batch before verl's body (so
  before the engine counts tokens), with the current policy's statistics when ``stats_source=current_minibatch``;
  the silenced tokens are dumped when ``dump_tokens`` is set; the mask's metrics, the mask statistics
  (:mod:`stapo_verl.diagnostics.stats`; one ``all_gather_object`` over DP per mini-batch of their own, after the
  mask's exchange, and none with ``mask_statistics=False``) and the LM-head gradient norm (:mod:`.engine_grads`)
  join the output. When the driver asked for diagnostics (:data:`stapo_verl.diagnostics.shipping.REQUEST_KEY`), the
  last mini-batch of the update also carries the update's histograms and, when a table is due, the token rows of
  every DP rank (:class:`stapo_verl.diagnostics.shipping.DiagnosticsPayload`).

What verl would pass through ``train_mini_batch`` upstream (the mini-batch index within the step) is kept on the
worker instance in a :class:`MiniBatchCursor`: the index counts ``train_batch`` calls since the last mini-batch that
verl flagged ``update_lr_scheduler`` (the last of each ``train_mini_batch`` call), which is exactly
``train_mini_batch``'s loop index.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from stapo_verl.core import losses as core_losses
from stapo_verl.core.losses import POLICY_BATCH_NUM_TOKENS_KEY, POLICY_LOSS_MASK_KEY, apply_policy_token_mask
from stapo_verl.core.masks import S2T_FIELDS, S2T_TOKEN_MASKS, global_step_of
from stapo_verl.diagnostics.shipping import PAYLOAD_KEY, REQUEST_KEY, DiagnosticsPayload, gather_rows, table_rows
from stapo_verl.diagnostics.stats import MaskStatistics, is_vocab_size, mask_statistics
from stapo_verl.integration.verl_0_9_1.engine_grads import reading_lm_head_grad_norm
from stapo_verl.integration.verl_0_9_1.job import record_acted

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


def actor_config_of(loss_fn):
    """The actor config a worker's loss function was built with (``partial(..., config=...)``), or None."""
    config = getattr(loss_fn, "keywords", {}).get("config") if loss_fn is not None else None
    return config if hasattr(config, "policy_loss") else None


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


def _current_minibatch_mask(worker, config, data, dp_group) -> tuple[dict, object]:
    """The mask from the current policy's log-prob and entropy; with ``mask_statistics``, also the old-policy mask,
    for a diagnostic. Returns the metrics and the masked mini-batch (the current fields)."""
    from stapo_verl.minibatch.current_policy import as_response_layout, current_policy_statistics

    log_prob, entropy, seconds = current_policy_statistics(worker.engine, data, current_forward_keys(worker))
    current = data.copy()
    current["old_log_probs"] = as_response_layout(log_prob, data["old_log_probs"])
    current["entropy"] = as_response_layout(entropy, data["entropy"])
    metrics = apply_policy_token_mask(config, current, dp_group)
    if config.policy_loss.mask_statistics:
        metrics.update(_mask_disagreement(config, data, current, dp_group))
    metrics["actor/stapo/current_forward_s"] = seconds
    from verl.utils import tensordict_utils as tu

    data[POLICY_LOSS_MASK_KEY] = current[POLICY_LOSS_MASK_KEY]
    tu.assign_non_tensor(data, **{POLICY_BATCH_NUM_TOKENS_KEY: tu.get(current, POLICY_BATCH_NUM_TOKENS_KEY)})
    return metrics, current


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
    ``all_gather_object`` over ``dp_group``, on every rank of it."""
    return mask_statistics(padded["old_log_probs"], padded["entropy"], padded["advantages"], padded["response_mask"],
                           padded[POLICY_LOSS_MASK_KEY], tau_p=config.policy_loss.s2t_tau_p, group=dp_group,
                           vocab_size=vocab_size, loss_agg_mode=config.loss_agg_mode,
                           rollout_is_weights=padded.get("rollout_is_weights"))


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


def wrap_train_batch(orig):
    """The ``TrainingWorker.train_batch`` replacement (see the module docstring)."""

    @functools.wraps(orig)
    def train_batch(self, data):
        config = actor_config_of(self.loss_fn)
        if config is None or config.policy_loss.get("token_mask", None) is None:
            return orig(self, data)
        record_acted(_PREFIX + "TrainingWorker.train_batch")
        loss = getattr(self.loss_fn, "func", None)
        if loss is not core_losses.ppo_loss and not getattr(loss, _MARK, False):
            raise TokenMaskIntegrationError(
                f"actor.policy_loss.token_mask={config.policy_loss.token_mask!r} is set, but this worker's loss "
                f"function is {getattr(self.loss_fn, 'func', self.loss_fn)!r}, not stapo_verl.core.losses.ppo_loss "
                "(distillation, or a verl whose ActorRolloutRefWorker.init_model no longer builds the loss from "
                "verl.workers.engine_workers.ppo_loss); the mask would not be applied"
            )
        from verl.utils import tensordict_utils as tu

        cursor = self.__dict__.setdefault("_stapo_cursor", MiniBatchCursor())
        step = global_step_of(tu.get(data, "global_steps")) if "global_steps" in data.keys() else 0
        index = cursor.enter(step)
        if "global_steps" not in data.keys():
            tu.assign_non_tensor(data, global_steps=step)
        tu.assign_non_tensor(data, mini_batch_index=index)
        dp_group = self.engine.get_data_parallel_group()
        pl = config.policy_loss
        is_output_rank = bool(self.engine.is_mp_src_rank_with_outputs())
        s2t = pl.token_mask in S2T_TOKEN_MASKS
        statistics = s2t and is_output_rank and bool(pl.mask_statistics)  # the same on every rank of a DP group

        if pl.stats_source == "current_minibatch":
            metrics, masked = _current_minibatch_mask(self, config, data, dp_group)
        else:
            metrics, masked = apply_policy_token_mask(config, data, dp_group), data
        padded = _padded_fields(masked) if s2t and (statistics or pl.dump_tokens) else None
        if padded is not None:
            padded[POLICY_LOSS_MASK_KEY] = _padded(masked[POLICY_LOSS_MASK_KEY])
        if statistics:
            stats = minibatch_statistics(config, padded, vocab_size_of(self), dp_group)
            metrics.update(stats.to_metrics())
            cursor.add_histograms(stats.histograms)
        # the driver's request (None: no diagnostics asked for, e.g. a trainer without the plugin's driver patch)
        request = tu.get(data, REQUEST_KEY, default=None)
        rows = _dump(self, config, data, padded, metrics, step, index, cursor) if padded is not None else []
        if request is not None:
            cursor.rows.extend(rows)
        last = bool(tu.get(data, "update_lr_scheduler", default=False))
        try:
            with reading_lm_head_grad_norm(self.engine, {}) as lm_head:
                output = orig(self, data)
        finally:
            cursor.leave(last)
        output_metrics = tu.get(output, "metrics") if output is not None else None
        lm_norm = lm_head.get("norm")
        payload = None
        if last and request is not None and is_output_rank:
            payload = _payload(config, cursor, step, bool(request), dp_group,
                               self.engine.get_data_parallel_rank())
        elif last:
            cursor.take_update()
        if output_metrics is not None:
            output_metrics.update(metrics)
            if lm_norm is not None:
                output_metrics[LM_HEAD_GRAD_NORM_KEY] = lm_norm
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
        if config.policy_loss.get("token_mask", None) is None:
            return orig(*args, **kwargs)
        record_acted(_PREFIX + "ppo_loss")
        return core_losses.ppo_loss(*args, **kwargs)

    setattr(ppo_loss, _MARK, True)
    return ppo_loss


def patch_engine_workers(module) -> None:
    """Post-import hook of ``verl.workers.engine_workers``: rebind ``ppo_loss`` to :func:`wrap_ppo_loss`'s
    dispatcher, wrap ``train_batch`` (idempotent)."""
    if not getattr(module.ppo_loss, _MARK, False):
        module.ppo_loss = wrap_ppo_loss(module.ppo_loss)
    cls = module.TrainingWorker
    if not getattr(cls.train_batch, _MARK, False):
        cls.train_batch = wrap_train_batch(cls.train_batch)


def is_installed() -> bool:
    """True if this process's ``verl.workers.engine_workers`` carries the patches (imports that module)."""
    import verl.workers.engine_workers as engine_workers

    return getattr(engine_workers.ppo_loss, _MARK, False) and getattr(
        engine_workers.TrainingWorker.train_batch, _MARK, False
    )
