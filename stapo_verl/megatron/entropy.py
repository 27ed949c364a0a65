"""Gradient-free, token-chunked vocab-parallel entropy for the Megatron engine (TP-sharded logits).

verl's Megatron logits processor (``MegatronEngineWithLMHead._lm_head_logits_processor``,
``verl/workers/engine/megatron/transformer_impl.py``) divides the logits by the temperature in place, then — when
``calculate_entropy`` — clones them and computes a *gradient-carrying* ``vocab_parallel_entropy`` before
``vocab_parallel_log_probs_from_logits`` (Megatron's cross-entropy, which overwrites its input). STAPO only needs
the entropy as a detached statistic, so for STAPO's current-policy routes :func:`wrap_lm_head_logits_processor`
computes it here instead: under ``no_grad``, in fp32, chunked over tokens (never over the vocabulary, bug D4),
*before* verl's in-place ops, then lets verl compute the log-probs without the clone.
"""

from __future__ import annotations

import functools

import torch

from stapo_verl import state

DEFAULT_CHUNK_TOKENS = 2048


def vocab_parallel_entropy_no_grad(
    vocab_parallel_logits: torch.Tensor,
    temperature: torch.Tensor | float | None = None,
    chunk_size: int | None = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Entropy (nats, fp32, no grad) of temperature-scaled logits sharded over the TP group along the vocab.

    Args:
        vocab_parallel_logits: (..., V/tp) logits of this TP rank, any float dtype; not modified.
        temperature: None, a float, or a tensor of shape ``logits.shape[:-1]`` (per-token temperature, as verl's
            processor receives it); values ≤ 0 are treated as 1e-8 like verl does.
        chunk_size: tokens per chunk (None or ≤ 0: all at once). Peak extra memory is one fp32 chunk.
    Returns:
        (...,) float32 entropy, identical on every TP rank.
    Raises:
        ValueError: temperature tensor shape does not match the token dims.
    Source: verl ``verl/utils/megatron/tensor_parallel.py::vocab_parallel_entropy`` (the TP reduction used
    here, per chunk); spec A6/A7 (temperature-scaled, fp32).
    """
    from verl.utils.megatron.tensor_parallel import vocab_parallel_entropy

    lead = vocab_parallel_logits.shape[:-1]
    x = vocab_parallel_logits.reshape(-1, vocab_parallel_logits.shape[-1])
    if isinstance(temperature, torch.Tensor):
        if tuple(temperature.shape) != tuple(lead):
            raise ValueError(f"temperature shape {tuple(temperature.shape)} != logits token dims {tuple(lead)}")
        t = temperature.reshape(-1).float().clamp_min(1e-8)
    else:
        t = None if temperature is None else torch.full((x.shape[0],), max(float(temperature), 1e-8))
    n = x.shape[0]
    step = n if not chunk_size or chunk_size <= 0 else int(chunk_size)
    out = torch.empty(n, dtype=torch.float32, device=x.device)
    with torch.no_grad():
        for s in range(0, n, max(step, 1)):
            chunk = x[s : s + step].float()
            if t is not None:
                chunk = chunk / t[s : s + step].to(chunk.device).unsqueeze(-1)
            out[s : s + step] = vocab_parallel_entropy(chunk)
    return out.reshape(lead)


def wrap_lm_head_logits_processor(orig):
    """Replacement for ``MegatronEngineWithLMHead._lm_head_logits_processor``.

    Active only while a STAPO current-policy mini-batch is being trained in this process
    (``state.MINIBATCH.detached_entropy``); otherwise it is ``orig`` unchanged. When active and verl asks for the
    entropy, it returns ``orig(..., calculate_entropy=False)`` (no logits clone, no entropy graph) plus
    ``"entropy"`` from :func:`vocab_parallel_entropy_no_grad` computed before ``orig`` touches the logits.
    """

    @functools.wraps(orig)
    def _lm_head_logits_processor(self, logits, label, temperature, *, calculate_entropy, **kwargs):
        mb = state.MINIBATCH
        if not (calculate_entropy and mb.active and mb.detached_entropy):
            return orig(self, logits, label, temperature, calculate_entropy=calculate_entropy, **kwargs)
        chunk = getattr(getattr(self, "engine_config", None), "entropy_from_logits_chunk_size", DEFAULT_CHUNK_TOKENS)
        entropy = vocab_parallel_entropy_no_grad(logits.detach(), temperature, chunk_size=chunk)
        ret = orig(self, logits, label, temperature, calculate_entropy=False, **kwargs)
        ret["entropy"] = entropy
        return ret

    _lm_head_logits_processor.__stapo_wrapped__ = True
    return _lm_head_logits_processor


def patch_megatron_engine(module) -> None:
    """Install :func:`wrap_lm_head_logits_processor` on verl's Megatron engine class (idempotent)."""
    cls = module.MegatronEngineWithLMHead
    if not getattr(cls._lm_head_logits_processor, "__stapo_wrapped__", False):
        cls._lm_head_logits_processor = wrap_lm_head_logits_processor(cls._lm_head_logits_processor)
