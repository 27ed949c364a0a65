"""The memory plan of a composed config: what each phase of a step holds on one GPU, per term, against its memory.

Phases of verl 0.9.1's v1 trainer on the Megatron engine with a colocated (hybrid) vLLM rollout, in step order:

1. **rollout**: vLLM awake (``gpu_memory_utilization`` of the GPU: weights + KV cache + its activations); of the
   Megatron state only what is not offloaded (``megatron.param_offload`` / ``optimizer_offload``).
2. **weight sync**: vLLM's weights woken, its KV cache released (``vLLMHttpServer.release_kv_cache``: sleep, then
   ``wake_up(tags=["weights"])``), Megatron's bf16 parameters on the GPU, one checkpoint-engine bucket
   (``rollout.checkpoint_engine.update_weights_bucket_megabytes``) and the largest tensor gathered to full size (the
   bridge exports whole HF tensors: the embedding / LM head, V x h).
3. **old-log-prob with entropy**: ``engine.eval_mode()`` moves only the parameters to the GPU
   (``verl.workers.engine.base.BaseEngineCtx._context_switch``: ``optimizer=False, grad=False``); no-grad forward at
   ``rollout.log_prob_max_token_len_per_gpu``. Logits: verl's ``_compute_logits_and_log_probs`` (Megatron engine)
   holds the bf16 vocab-parallel logits and ``logits.clone()`` for the entropy; ``vocab_parallel_entropy`` makes one
   more bf16 copy (``logits - max``, then in-place ``exp_``/``div_``), freed before the log-probs; Megatron-Core's
   ``vocab_parallel_cross_entropy`` then upcasts the clone to fp32 (``calculate_logits_max``: ``.float()``). Peak:
   bf16 + clone + fp32 = **4 bf16 copies**. ``entropy_from_logits_with_chunking`` shrinks only the entropy's copy
   (3 → 2 + a chunk), not that peak; ``model.use_fused_kernels`` (``verl.models.mcore.model_forward_fused``) computes
   log-probs and entropy from the hidden states in chunks and holds no full logits.
4. **actor update**: ``engine.train_mode()`` moves parameters, fp32 main gradients (Megatron DDP with
   ``grad_reduce_in_fp32=True``, ``verl.utils.megatron_utils``) and the distributed-optimizer shard (fp32 master +
   Adam m, v = 12 bytes a parameter over DP; Megatron-Core "Distributed Optimizer") to the GPU. Activations at
   ``actor.ppo_max_token_len_per_gpu`` with full recompute (``recompute_granularity=full``, uniform, 1 layer): each
   layer's input is checkpointed (``L·T·h·2`` bytes, ÷ TP under sequence parallelism) and one layer is live while it
   is recomputed (≈ ``34·T·h`` bytes ÷ TP with flash attention: Korthikanti et al. 2022, arXiv 2205.05198, Eq. 2
   without the ``5as/h`` term). Logits without entropy: the bf16 logits and the fp32 copy in the cross-entropy forward,
   which becomes the softmax saved for backward: **3 bf16 copies** (5 with a gradient-carrying entropy: the clone and
   the entropy's saved softmax).
5. **current-policy forward** (``stats_source=current_minibatch`` only): the no-grad forward with entropy of
   :mod:`stapo_verl.minibatch.current_policy`, inside ``train_batch`` (``eval_mode(disable_auto_offload=True)``): the
   whole training state of phase 4 stays on the GPU, plus the 4 logits copies of phase 3 at the *training* budget
   (:func:`current_forward_tokens`, the same rule as the worker's ``current_forward_keys``).

No-grad forwards hold no checkpointed activations; their largest per-layer transient is the MLP: fc1's output
``[T, 2I/TP]``, the SwiGLU output ``[T, I/TP]`` and the all-gathered input ``[T, h]``, bf16. vLLM is asleep (level
2: weights and KV cache discarded, ``_resolve_sleep_level``) in phases 3–5. Each phase adds :data:`RESERVE_GB` for
CUDA contexts, NCCL buffers and allocator fragmentation (an allowance, not a code path). GB = 10⁹ bytes.

These are estimates from the code paths, not measurements: the first steps' ``perf/max_memory_allocated_gb`` is the
check. A phase within :data:`MARGIN` of the GPU's memory gets the verl 0.9.1 options that lower it, each with the
amount it saves in this model (:func:`plan`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
from dataclasses import dataclass

GB = 1e9
#: CUDA context, NCCL buffers, allocator fragmentation, per GPU and phase (an allowance)
RESERVE_GB = 4.0
#: a phase above (1 - MARGIN) of the GPU's memory gets advice
MARGIN = 0.10
#: the GPU the recipes are sized for (H100 80 GB) when no GPU is visible
DEFAULT_GPU_GB = 80.0
#: token budgets the advice proposes are multiples of this
BUDGET_STEP = 1024

_A = "actor_rollout_ref"
CHUNKING_KEY = f"{_A}.actor.entropy_from_logits_with_chunking"
FUSED_KEY = f"{_A}.model.use_fused_kernels"
TRAIN_BUDGET_KEY = f"{_A}.actor.ppo_max_token_len_per_gpu"
LOGPROB_BUDGET_KEY = f"{_A}.rollout.log_prob_max_token_len_per_gpu"
GPU_UTIL_KEY = f"{_A}.rollout.gpu_memory_utilization"


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder's sizes (HF ``config.json`` names). ``tied``: ``tie_word_embeddings``."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = False

    def layer_params(self) -> int:
        """Parameters of one layer split over TP: q, k, v, o projections and the SwiGLU MLP (gate, up, down)."""
        h, d = self.hidden, self.head_dim
        return h * self.heads * d + 2 * h * self.kv_heads * d + self.heads * d * h + 3 * h * self.intermediate

    def replicated_layer_params(self) -> int:
        """Parameters of one layer every TP rank holds whole: two RMSNorms and Qwen3's q/k norms."""
        return 2 * self.hidden + 2 * self.head_dim

    def embedding_params(self) -> int:
        """Input embedding plus the LM head when untied."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        """All parameters (final norm included)."""
        return (self.layers * (self.layer_params() + self.replicated_layer_params()) + self.embedding_params()
                + self.hidden)

    def params_per_gpu(self, tp: int, pp: int = 1) -> float:
        """Parameters one GPU holds: its TP shard of ``layers / pp`` layers and of the (vocab-parallel) embedding and
        LM head (both counted on one stage: an upper bound for PP > 1)."""
        layers = math.ceil(self.layers / pp)
        return (layers * (self.layer_params() / tp + self.replicated_layer_params()) + self.embedding_params() / tp
                + self.hidden)


def shape_from_hf(cfg: dict) -> ModelShape:
    """A :class:`ModelShape` from a HF ``config.json`` dict; raises KeyError for a missing field."""
    heads = cfg["num_attention_heads"]
    return ModelShape(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                      kv_heads=cfg.get("num_key_value_heads", heads),
                      head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                      intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                      tied=bool(cfg.get("tie_word_embeddings", False)))


#: ``config.json`` of the models the recipes train (https://huggingface.co/Qwen/Qwen3-1.7B-Base, -8B-Base, -14B-Base)
KNOWN_MODELS = types.MappingProxyType({
    "qwen3-1.7b": ModelShape(2048, 28, 16, 8, 128, 6144, 151936, tied=True),
    "qwen3-8b": ModelShape(4096, 36, 32, 8, 128, 12288, 151936),
    "qwen3-14b": ModelShape(5120, 40, 40, 8, 128, 17408, 151936),
})


def model_shape(model_path: str) -> tuple[ModelShape | None, str]:
    """The shape of ``model.path``: its ``config.json`` when local, else :data:`KNOWN_MODELS` by name (``-Base`` and
    ``-Instruct`` suffixes ignored). Returns ``(shape or None, where it came from)``; raises nothing."""
    path = os.path.expanduser(str(model_path))
    cfg = os.path.join(path, "config.json")
    if os.path.isfile(cfg):
        try:
            with open(cfg, encoding="utf-8") as f:
                return shape_from_hf(json.load(f)), cfg
        except (OSError, ValueError, KeyError):
            return None, f"{cfg} unreadable"
    name = os.path.basename(path.rstrip("/")).lower()
    for suffix in ("-base", "-instruct"):
        name = name.removesuffix(suffix)
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name], f"{name}'s HF config.json values"
    return None, f"{model_path!r} is neither a local HF directory nor one of {sorted(KNOWN_MODELS)}"


@dataclass(frozen=True)
class Settings:
    """What the plan reads from the composed config (see :func:`settings`)."""

    tp: int
    pp: int
    cp: int
    dp: int
    rollout_tp: int
    gpu_util: float
    param_offload: bool
    optimizer_offload: bool
    distributed_optimizer: bool
    sequence_parallel: bool
    full_recompute: bool
    train_tokens: int
    logprob_tokens: int
    current_tokens: int | None
    update_entropy: bool
    chunking: bool
    fused: bool
    bucket_mb: float
    longest: int
    fp8: str | None = None
    fp8_recipe: str | None = None
    fp8_param: bool = False
    rollout_fp8: bool = False

    @property
    def precision(self) -> str:
        """What the plan assumes, in one phrase (printed in its first line)."""
        if not self.fp8:
            return "BF16 (bf16 parameters and activations, fp32 main grads and Adam; vLLM bf16 weights)"
        params = "fp8 parameters (fp8_param)" if self.fp8_param else "bf16 parameters + TE's cached FP8 weight copies"
        rollout = "vLLM fp8 weights" if self.rollout_fp8 else "vLLM bf16 weights"
        return (f"FP8 (TE {self.fp8}/{self.fp8_recipe}: {params}; fp32 main grads and Adam; activations counted in "
                f"bf16, an upper bound; {rollout})")


def current_forward_tokens(config) -> int | None:
    """The token budget of the ``stats_source=current_minibatch`` forward, or None for another statistics source:
    the training budget ``actor.ppo_max_token_len_per_gpu`` (what verl puts in ``engine_config.max_token_len_per_gpu``,
    which ``training_worker.current_forward_keys`` passes to the forward)."""
    from omegaconf import OmegaConf

    if OmegaConf.select(config, f"{_A}.actor.policy_loss.stats_source", default=None) != "current_minibatch":
        return None
    return int(OmegaConf.select(config, TRAIN_BUDGET_KEY))


def settings(config) -> Settings:
    """:class:`Settings` of a composed (Megatron) trainer config; raises OmegaConf's errors for a missing key."""
    from omegaconf import OmegaConf

    def sel(key, default=None):
        return OmegaConf.select(config, key, default=default)

    mg = f"{_A}.actor.megatron"
    tp, pp, cp = (int(sel(f"{mg}.{k}_parallel_size", 1)) for k in ("tensor_model", "pipeline_model", "context"))
    world = int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    tc = sel(f"{mg}.override_transformer_config", {}) or {}
    return Settings(
        tp=tp, pp=pp, cp=cp, dp=max(1, world // (tp * pp * cp)), rollout_tp=int(sel(f"{_A}.rollout.tensor_model_parallel_size", 1)),
        gpu_util=float(sel(GPU_UTIL_KEY, 0.5)), param_offload=bool(sel(f"{mg}.param_offload", False)),
        optimizer_offload=bool(sel(f"{mg}.optimizer_offload", False)),
        distributed_optimizer=bool(sel(f"{mg}.use_distributed_optimizer", True)),
        sequence_parallel=bool(sel(f"{mg}.sequence_parallel", True)) and tp > 1,
        full_recompute=tc.get("recompute_granularity", None) == "full",
        train_tokens=int(sel(TRAIN_BUDGET_KEY)), logprob_tokens=int(sel(LOGPROB_BUDGET_KEY)),
        current_tokens=current_forward_tokens(config),
        update_entropy=bool(sel(f"{_A}.actor.calculate_entropy", False)) or float(sel(f"{_A}.actor.entropy_coeff", 0)) != 0,
        chunking=bool(sel(f"{mg}.entropy_from_logits_with_chunking", False)),
        fused=bool(sel(FUSED_KEY, False)),
        bucket_mb=float(sel(f"{_A}.rollout.checkpoint_engine.update_weights_bucket_megabytes", 2048)),
        longest=int(config.data.max_prompt_length) + int(config.data.max_response_length),
        fp8=None if tc.get("fp8", None) in (None, False) else str(tc.get("fp8")),
        fp8_recipe=tc.get("fp8_recipe", None), fp8_param=bool(tc.get("fp8_param", False)),
        rollout_fp8=sel(f"{_A}.rollout.quantization", None) == "fp8",
    )


@dataclass(frozen=True)
class Term:
    """One term of a phase: name, GB, and how it is computed."""

    name: str
    gb: float
    formula: str


@dataclass(frozen=True)
class Phase:
    """One phase on one GPU: its terms (the reserve included), the token budget it runs at, and advice lines."""

    name: str
    tokens: int | None
    terms: tuple[Term, ...]
    advice: tuple[str, ...] = ()

    @property
    def total_gb(self) -> float:
        return sum(t.gb for t in self.terms)

    def term(self, name: str) -> float:
        """GB of the term ``name`` (0 when the phase has none)."""
        return sum(t.gb for t in self.terms if t.name == name)


@dataclass(frozen=True)
class MemoryPlan:
    """Every phase of a step on one GPU of ``gpu_gb``."""

    model: str
    gpu_gb: float
    phases: tuple[Phase, ...]
    precision: str = ""

    def phase(self, name: str) -> Phase:
        """The phase ``name``; raises KeyError."""
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total_gb)

    @property
    def fits(self) -> bool:
        return self.peak.total_gb <= self.gpu_gb

    def lines(self) -> list[str]:
        """The plan as printed by ``--dry-run``: one line per phase, its terms, then advice."""
        out = [f"memory plan per GPU ({self.model}; GPU {self.gpu_gb:.1f} GB; GB = 1e9 bytes; estimates from "
               f"verl 0.9.1 / Megatron-Core code paths, stapo_verl/launch/memory_plan.py):",
               f"  precision assumed: {self.precision}"]
        for p in self.phases:
            budget = f" at {p.tokens} tokens" if p.tokens else ""
            flag = "  OVER" if p.total_gb > self.gpu_gb else ("  within 10 %" if p.advice else "")
            out.append(f"  {p.name}{budget}: {p.total_gb:.1f} GB{flag} = "
                       + " + ".join(f"{t.name} {t.gb:.1f}" for t in p.terms if t.gb > 0.005))
            out += [f"    lower it: {a}" for a in p.advice]
        out.append(f"  peak: {self.peak.name} {self.peak.total_gb:.1f} of {self.gpu_gb:.1f} GB"
                   + ("" if self.fits else " -- does not fit"))
        return out


def _logits_copy(shape: ModelShape, s: Settings, tokens: int) -> float:
    """GB of one bf16 copy of the vocab-parallel logits at ``tokens`` tokens a GPU (÷ CP: each CP rank holds its
    share of the sequence)."""
    return tokens / s.cp * shape.vocab / s.tp * 2 / GB


def _mlp_transient(shape: ModelShape, s: Settings, tokens: int) -> float:
    """GB of a no-grad layer's largest transient: fc1 ``[T, 2I/TP]`` + SwiGLU ``[T, I/TP]`` + gathered ``[T, h]``."""
    t = tokens / s.cp
    return t * (2 * 2 * shape.intermediate / s.tp + 2 * shape.intermediate / s.tp + 2 * shape.hidden) / GB


def _gemm_params_per_gpu(shape: ModelShape, s: Settings) -> float:
    """Parameters of one GPU that TE's FP8 GEMMs read: the TP shards of its layers' projections (the embedding and
    Megatron-Core's output layer are not TE modules and stay bf16)."""
    return math.ceil(shape.layers / s.pp) * shape.layer_params() / s.tp


def _static(shape: ModelShape, s: Settings) -> tuple[Term, Term, Term]:
    """The parameters, fp32 main gradients and the optimizer shard of one GPU. Parameters: bf16 (2 B); under FP8
    with ``fp8_param`` the GEMM weights are held in fp8 (1 B, Megatron-Core ``TransformerConfig.fp8_param``);
    without it (the recipes' setting) TE keeps, beside the bf16 weights, an FP8 copy of each GEMM weight and of its
    transpose for the step's micro-batches (``transformer_engine.pytorch.Linear.forward(is_first_microbatch=...)``
    caches the FP8 weights): + 2 B per GEMM parameter, counted in every phase that holds the bf16 weights (an upper
    bound for the no-grad passes, where TE casts without keeping the cache)."""
    p = shape.params_per_gpu(s.tp, s.pp)
    over = s.dp if s.distributed_optimizer else 1
    if s.fp8:
        gemm = _gemm_params_per_gpu(shape, s)
        if s.fp8_param:
            params = Term("params", (2 * (p - gemm) + 1 * gemm) / GB,
                          "2 B x non-GEMM P + 1 B x GEMM P/(TP.PP) (fp8_param)")
        else:
            params = Term("params", (2 * p + 2 * gemm) / GB,
                          "2 B x P/(TP.PP) (bf16) + 2 B x GEMM P/(TP.PP) (TE's FP8 weight and transpose caches)")
    else:
        params = Term("params", 2 * p / GB, "2 B x P/(TP.PP) (bf16)")
    return (params,
            Term("grads", 4 * p / GB, "4 B x P/(TP.PP) (fp32 main grads, grad_reduce_in_fp32)"),
            Term("optimizer", 12 * p / over / GB, f"12 B x P/(TP.PP.DP) (fp32 master + Adam m, v; DP={over})"))


def _reserve() -> Term:
    return Term("reserve", RESERVE_GB, "CUDA context, NCCL, fragmentation (allowance)")


def _phases(shape: ModelShape, s: Settings, gpu_gb: float) -> list[Phase]:
    params, grads, optim = _static(shape, s)
    zero = Term("", 0.0, "")
    rollout_resident = (params if not s.param_offload else zero, grads if not s.param_offload else zero,
                        optim if not s.optimizer_offload else zero)
    eval_resident = (params, grads if not s.param_offload else zero, optim if not s.optimizer_offload else zero)
    # vLLM's fp8 quantization (rollout.quantization=fp8) stores the linear layers' weights in fp8; the embedding and
    # LM head stay bf16 (verl's FP8 path quantises LinearBase layers only)
    gemm_all = shape.layers * shape.layer_params()
    vllm_weights = ((shape.params() - gemm_all) * 2 + gemm_all * (1 if s.rollout_fp8 else 2)) / s.rollout_tp / GB
    phases = [
        Phase("rollout", None, (*[t for t in rollout_resident if t.gb], Term(
            "vLLM", s.gpu_util * gpu_gb, f"{GPU_UTIL_KEY} x GPU (weights {vllm_weights:.1f} + KV cache)"), _reserve())),
        Phase("weight sync", None, (*[t for t in eval_resident if t.gb],
                                    Term("vLLM weights", vllm_weights, "1 B x linear P + 2 B x the rest, / rollout "
                                         "TP (fp8)" if s.rollout_fp8 else "2 B x P / rollout TP"),
                                    Term("bucket", s.bucket_mb * 2**20 / GB, "update_weights_bucket_megabytes"),
                                    Term("gathered tensor", shape.vocab * shape.hidden * 2 / GB, "V x h x 2 B"),
                                    _reserve())),
    ]
    copies = 0 if s.fused else 4
    phases.append(Phase("old-log-prob with entropy", s.logprob_tokens, (
        *[t for t in eval_resident if t.gb],
        Term("logits", copies * _logits_copy(shape, s, s.logprob_tokens),
             f"{copies} bf16 copies of T.V/TP (logits, clone, fp32 cross-entropy copy)"),
        Term("activations", _mlp_transient(shape, s, s.logprob_tokens), "one layer's MLP transient (no grad)"),
        _reserve())))
    t = s.train_tokens / s.cp
    sp = s.tp if s.sequence_parallel else 1
    live = 34 * t * shape.hidden / s.tp / GB
    acts = (shape.layers / s.pp * t * shape.hidden * 2 / sp / GB, live) if s.full_recompute else (
        shape.layers / s.pp * live, 0.0)
    update_copies = 0 if s.fused else (5 if s.update_entropy else 3)
    phases.append(Phase("actor update", s.train_tokens, (
        params, grads, optim,
        Term("checkpointed", acts[0], "L.T.h.2 B / TP (layer inputs, full recompute, sequence parallel)"
             if s.full_recompute else "L x 34.T.h / TP (no recompute)"),
        Term("live layer", acts[1], "34.T.h / TP (one layer recomputed)"),
        Term("logits", update_copies * _logits_copy(shape, s, s.train_tokens),
             f"{update_copies} bf16 copies (logits, fp32 softmax saved for backward)"),
        _reserve())))
    if s.current_tokens is not None:
        phases.append(Phase("current-policy forward", s.current_tokens, (
            params, grads, optim,
            Term("logits", copies * _logits_copy(shape, s, s.current_tokens), f"{copies} bf16 copies, as old-log-prob"),
            Term("activations", _mlp_transient(shape, s, s.current_tokens), "one layer's MLP transient (no grad)"),
            _reserve())))
    return phases


def _budget_key(phase: str) -> str:
    return LOGPROB_BUDGET_KEY if phase == "old-log-prob with entropy" else TRAIN_BUDGET_KEY


def _advice(shape: ModelShape, s: Settings, phase: Phase, gpu_gb: float) -> tuple[str, ...]:
    """The verl 0.9.1 options that lower ``phase`` (recomputed with each), with the GB each saves."""
    name, limit = phase.name, (1 - MARGIN) * gpu_gb

    def again(**changes) -> float:
        return next(p for p in _phases(shape, dataclasses.replace(s, **changes), gpu_gb) if p.name == name).total_gb

    out = []
    if name == "rollout":
        util = math.floor((limit - (phase.total_gb - phase.term("vLLM"))) / gpu_gb * 20) / 20
        return (f"{GPU_UTIL_KEY}={util:.2f}: -{phase.total_gb - again(gpu_util=util):.1f} GB",) if util > 0 else ()
    if name == "weight sync":
        return (f"{_A}.rollout.checkpoint_engine.update_weights_bucket_megabytes=512: "
                f"-{phase.total_gb - again(bucket_mb=512):.1f} GB",)
    if name in ("old-log-prob with entropy", "current-policy forward") and not s.chunking:
        saved = phase.total_gb - again(chunking=True)
        out.append(f"{CHUNKING_KEY}=True: -{saved:.1f} GB" + (
            " (it chunks only the entropy's copy; this peak is the log-prob step's fp32 copy)" if saved < 0.05 else ""))
    if not s.fused:
        out.append(f"{FUSED_KEY}=True: -{phase.total_gb - again(fused=True):.1f} GB (no full logits)")
    field = {"old-log-prob with entropy": "logprob_tokens", "actor update": "train_tokens",
             "current-policy forward": "current_tokens"}.get(name)
    if field:
        budget = getattr(s, field)
        while budget - BUDGET_STEP >= s.longest and again(**{field: budget}) > limit:
            budget -= BUDGET_STEP
        if budget < getattr(s, field) and again(**{field: budget}) <= limit:
            out.append(f"{_budget_key(name)}={budget}: -{phase.total_gb - again(**{field: budget}):.1f} GB")
        elif again(**{field: budget}) > limit:
            out.append(f"no token budget >= the longest sequence ({s.longest}) brings it under {limit:.1f} GB")
    return tuple(out)


def plan(shape: ModelShape, s: Settings, gpu_gb: float = DEFAULT_GPU_GB, model: str = "") -> MemoryPlan:
    """The memory plan of one GPU of ``gpu_gb`` GB (see the module docstring for every term's source).

    Args:
        shape: the model (:func:`model_shape`).
        s: the config's settings (:func:`settings`).
        gpu_gb: the GPU's memory (10⁹ bytes).
        model: the model's name for the printed plan.

    Returns:
        :class:`MemoryPlan`; a phase above ``(1 - MARGIN) x gpu_gb`` carries advice (:func:`_advice`).
    """
    phases = [dataclasses.replace(p, advice=_advice(shape, s, p, gpu_gb)) if p.total_gb > (1 - MARGIN) * gpu_gb else p
              for p in _phases(shape, s, gpu_gb)]
    return MemoryPlan(model, gpu_gb, tuple(phases), s.precision)


def plan_for_config(config, gpu_gb: float = DEFAULT_GPU_GB) -> tuple[MemoryPlan | None, str]:
    """:func:`plan` of a composed config, or ``(None, why not)`` (FSDP engine, unknown model). Raises nothing."""
    if str(config.actor_rollout_ref.actor.strategy) != "megatron":
        return None, f"actor.strategy={config.actor_rollout_ref.actor.strategy}: the plan covers the Megatron engine"
    shape, where = model_shape(str(config.actor_rollout_ref.model.path))
    if shape is None:
        return None, where
    return plan(shape, settings(config), gpu_gb, model=f"{config.actor_rollout_ref.model.path}, {where}"), where


#: the rows of :func:`markdown_table`: (label, phase name or None for the static terms)
_ROWS = (("params / grads / optimizer shard (resident in train mode)", None), ("rollout", "rollout"),
         ("weight sync", "weight sync"), ("old-log-prob with entropy", "old-log-prob with entropy"),
         ("actor update", "actor update"), ("current-policy forward (`stats_source=current_minibatch`)",
                                            "current-policy forward"))


def markdown_table(plans: dict[str, MemoryPlan]) -> str:
    """The plans of several recipes as one markdown table (docs/recipes.md §3 holds its output; a test regenerates
    it): per phase the total and, for phases with logits, the logits' share at the phase's budget.

    Args:
        plans: column title → plan (each with the current-policy phase, for its row).
    """
    head = "| GB per GPU | " + " | ".join(plans) + " |"
    out = [head, "|---|" + "---|" * len(plans)]
    for label, name in _ROWS:
        cells = []
        for p in plans.values():
            if name is None:
                up = p.phase("actor update")
                cells.append(" / ".join(f"{up.term(t):.1f}" for t in ("params", "grads", "optimizer")))
                continue
            try:
                ph = p.phase(name)
            except KeyError:
                cells.append("-")
                continue
            extra = [f"{ph.tokens} tokens"] if ph.tokens else []
            extra += [f"logits {ph.term('logits'):.1f}"] if ph.term("logits") else []
            extra += [f"vLLM {ph.term('vLLM'):.1f}"] if ph.term("vLLM") else []
            cells.append(f"**{ph.total_gb:.1f}**" + (f" ({', '.join(extra)})" if extra else ""))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)
