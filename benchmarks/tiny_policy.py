"""In-process access to the tiny CPU run's policy and data, shared by the benchmarks (no Ray, no verl trainer).

What the tiny run (``bash recipes/tiny_cpu_stapo.sh``) does at the start of a training step, rebuilt from verl's and
the project's own parts so a benchmark can hold a real batch in one process:

* prompts: the train rows of step k in the order verl's ``create_rl_sampler`` (``data.shuffle=True``, ``data.seed``)
  hands them to a ``train_batch_size`` data loader, rendered by the chat template as verl's dataset renders them
  (:func:`stapo_verl.cpu.make_assets.encode_chat`);
* responses: ``rollout.n`` samples per prompt at T = 1 from the CPU rollout server's sampler
  (:class:`stapo_verl.cpu.rollout_server.HFGenerator`, batch-invariant, prompts left-padded to
  ``max_prompt_length``), each request seeded by :func:`stapo_verl.core.seeding.rollout_request_seed` (the seed
  ``rollout.full_determinism=True`` gives it), stopping at end of sequence or end of turn;
* rewards: the project's scorer for the row's ``data_source`` (``stapo_verl.rewards.compute_score``, in process);
* advantages: verl's ``compute_grpo_outcome_advantage`` over the n samples of each prompt;
* statistics: one forward of prompt + response with full logits: log p of the sampled token, the entropy (verl's
  ``entropy_from_logits``) and Σ π² (verl's ``calculate_sum_pi_squared_from_logits``) of every response position.

Every random draw depends only on the seeds passed in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: the tiny recipe's settings this module reproduces (recipes/common/base.sh, size ``tiny``)
TINY = {"train_batch_size": 16, "rollout_n": 8, "max_prompt_length": 128, "max_response_length": 40,
        "data_seed": 1, "rollout_seed": 42, "tau_p": 0.1, "entropy_quantile": 0.75, "lr": 2e-4,
        "weight_decay": 0.1, "clip_grad": 1.0, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}


@dataclass
class Policy:
    """The tiny policy with its tokenizer.

    Attributes:
        model: ``Qwen3ForCausalLM`` (fp32, CPU, eval mode).
        tokenizer: its Hugging Face tokenizer.
        manifest: the assets' ``assets.json`` (paths of the data files, ``vocab_size``, ...).
        vocab_size: |V|, the width of the logits (``model.config.vocab_size``).
    """

    model: object
    tokenizer: object
    manifest: dict
    vocab_size: int


def load_policy(assets_dir: Path, checkpoint: Path | None = None) -> Policy:
    """The tiny policy: the warm start of ``assets_dir`` or, with ``checkpoint``, a tiny run's actor weights.

    Args:
        assets_dir: the tiny assets (``python -m stapo_verl.cpu.make_assets``; ``~/.cache/stapo_verl/tiny``).
        checkpoint: a verl FSDP actor checkpoint directory of a tiny run (``<run>/ckpt/global_step_<n>/actor``),
            or None for the warm start.

    Raises:
        FileNotFoundError: no ``assets.json`` in ``assets_dir``. ValueError: see :func:`load_actor_checkpoint`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest_path = Path(assets_dir) / "assets.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"{manifest_path} missing: build the assets with python -m stapo_verl.cpu.make_assets")
    manifest = json.loads(manifest_path.read_text())
    model = AutoModelForCausalLM.from_pretrained(manifest["model_dir"], dtype=torch.float32,
                                                 attn_implementation="sdpa", local_files_only=True)
    if checkpoint is not None:
        load_actor_checkpoint(model, Path(checkpoint))
    model.eval()
    tok = AutoTokenizer.from_pretrained(manifest["model_dir"], local_files_only=True)
    return Policy(model=model, tokenizer=tok, manifest=manifest, vocab_size=int(model.config.vocab_size))


def load_actor_checkpoint(model, actor_dir: Path) -> None:
    """Load a verl FSDP actor checkpoint of world size 1 (``model_world_size_1_rank_0.pt``) into ``model``.

    The file holds the model's state dict (DTensors under FSDP2; one shard = the whole tensor at world size 1).

    Raises:
        FileNotFoundError: the file is missing. ValueError: keys other than a tied ``lm_head.weight`` are missing or
            unexpected.
    """
    path = Path(actor_dir) / "model_world_size_1_rank_0.pt"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing (a tiny run's actor checkpoint at world size 1)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    state = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = getattr(model.config, "tie_word_embeddings", False)
    if unexpected or [k for k in missing if not (tied and k == "lm_head.weight")]:
        raise ValueError(f"{path}: missing keys {missing}, unexpected keys {unexpected}")


def read_rows(parquet: str) -> list[dict]:
    """The rows of a verl parquet file (``prompt``, ``data_source``, ``reward_model``, ``extra_info``)."""
    import pandas as pd

    return pd.read_parquet(parquet).to_dict("records")


def step_rows(rows: list[dict], *, data_seed: int, step: int, batch_size: int) -> list[dict]:
    """The rows of training step ``step`` (1-based, within the first epoch) as verl's data loader draws them.

    Raises:
        ValueError: ``step`` < 1 or beyond the first epoch.
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_sampler

    if step < 1 or step * batch_size > len(rows):
        raise ValueError(f"step={step} is outside the first epoch of {len(rows)} rows at batch size {batch_size}")
    order = list(iter(create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": data_seed}), rows)))
    return [rows[i] for i in order[(step - 1) * batch_size: step * batch_size]]


@dataclass
class Batch:
    """One batch of prompts × n responses in verl's response layout (B = prompts × n rows, T = max response).

    Attributes:
        input_ids: (B, L) int64, prompt + response, right-padded. attention_mask: (B, L) int64.
        prompt_len: (B,) int64, the prompt's length in each row (the response starts there).
        responses: (B, T) int64, the response tokens (pad after the end).
        response_mask: (B, T) bool.
        scores: (B,) float32, the scorer's reward (±1). uid: (B,) object, the prompt each row answers.
        advantages: (B, T) float32, GRPO advantages (0 on padding).
        log_prob, entropy, sum_pi_squared: (B, T) float32 statistics of the policy that sampled the batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_len: torch.Tensor
    responses: torch.Tensor
    response_mask: torch.Tensor
    scores: torch.Tensor
    uid: np.ndarray
    advantages: torch.Tensor | None = None
    log_prob: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def sample_batch(policy: Policy, rows: list[dict], *, n: int, rollout_seed: int, global_step: int, validate: bool,
                 max_prompt_length: int = TINY["max_prompt_length"],
                 max_response_length: int = TINY["max_response_length"]) -> Batch:
    """``n`` seeded samples at T = 1 for each row, scored, in verl's response layout (no statistics yet).

    Request seeds: :func:`stapo_verl.core.seeding.rollout_request_seed` of (``rollout_seed``, ``global_step``,
    ``validate``, the row's ``data_source``, its ``extra_info.index``, sample number 0 … n−1).
    """
    from stapo_verl.core.seeding import rollout_request_seed
    from stapo_verl.cpu.make_assets import encode_chat, stop_ids
    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings
    from stapo_verl.rewards import compute_score

    tok = policy.tokenizer
    prompts, seeds, meta = [], [], []
    for row in rows:
        ids = encode_chat(tok, row["prompt"][0]["content"])[-max_prompt_length:]  # data.truncation=left
        index = row["extra_info"]["index"]
        for k in range(n):
            prompts.append(ids)
            seeds.append(rollout_request_seed(rollout_seed, global_step=global_step, validate=validate,
                                              data_source=row["data_source"], sample_index=index, sample_number=k))
            meta.append(row)
    gen = HFGenerator(policy.model, stop_ids(tok), tok.pad_token_id, seed=0, pad_to=max_prompt_length)
    s = SamplingSettings(temperature=1.0, top_p=1.0, top_k=0, logprobs=False)
    outs = []
    for i in range(0, len(prompts), 64):
        outs += gen.generate(prompts[i:i + 64], [max_response_length] * len(prompts[i:i + 64]), s, seeds[i:i + 64])
    resp = [o[0] for o in outs]
    B, T = len(prompts), max(len(r) for r in resp)
    L = max(len(p) + len(r) for p, r in zip(prompts, resp))
    input_ids = torch.full((B, L), tok.pad_token_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    responses = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.bool)
    scores = torch.zeros(B, dtype=torch.float32)
    for i, (p, r, row) in enumerate(zip(prompts, resp, meta)):
        input_ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        attention[i, :len(p) + len(r)] = 1
        responses[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        response_mask[i, :len(r)] = True
        text = tok.decode(r, skip_special_tokens=True)  # as verl's reward managers decode
        scores[i] = float(compute_score(row["data_source"], text, row["reward_model"]["ground_truth"],
                                        timeout_s=0)["score"])
    uid = np.array([f"{row['data_source']}/{row['extra_info']['index']}" for row in meta], dtype=object)
    return Batch(input_ids=input_ids, attention_mask=attention, prompt_len=torch.tensor([len(p) for p in prompts]),
                 responses=responses, response_mask=response_mask, scores=scores, uid=uid)


def grpo_advantages(batch: Batch) -> torch.Tensor:
    """(B, T) float32: verl's ``compute_grpo_outcome_advantage`` (std-normalised, ε = 1e-6), the score placed on
    each response's last token as verl's reward managers place it."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    token_rewards = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
    last = batch.response_mask.sum(-1) - 1
    token_rewards[torch.arange(len(last)), last] = batch.scores
    adv, _ = compute_grpo_outcome_advantage(token_rewards, batch.response_mask.float(), batch.uid)
    return adv


def response_logits(model, batch: Batch) -> torch.Tensor:
    """(B, T, |V|) logits of the positions that predict the response tokens (padding rows: whatever the model
    gives; mask them with ``response_mask``). Differentiable when called with grad enabled."""
    L = batch.input_ids.shape[1]
    pos = torch.arange(L).expand_as(batch.input_ids)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=pos).logits
    T = batch.responses.shape[1]
    idx = (batch.prompt_len[:, None] - 1 + torch.arange(T)[None, :]).clamp_max(L - 1)
    return torch.gather(logits, 1, idx[..., None].expand(-1, -1, logits.shape[-1]))


def response_log_prob(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B, T) log p of the sampled response tokens under ``logits`` (differentiable)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.responses[..., None]).squeeze(-1)


@torch.no_grad()
def add_statistics(policy: Policy, batch: Batch) -> Batch:
    """Fill ``log_prob``, ``entropy`` (verl's ``entropy_from_logits``) and ``sum_pi_squared`` (verl's
    ``calculate_sum_pi_squared_from_logits``) from one forward of ``policy.model``; 0 on padding."""
    from verl.utils.torch_functional import calculate_sum_pi_squared_from_logits, entropy_from_logits

    logits = response_logits(policy.model, batch).float()
    m = batch.response_mask
    batch.log_prob = torch.where(m, response_log_prob(logits, batch), 0.0)
    batch.entropy = torch.where(m, entropy_from_logits(logits), 0.0)
    batch.sum_pi_squared = torch.where(m, calculate_sum_pi_squared_from_logits(logits), 0.0)
    return batch


@torch.no_grad()
def mean_response_entropy(model, batch: Batch) -> float:
    """Token-mean entropy (nats) of ``model``'s next-token distributions at ``batch``'s response positions
    (teacher-forced: the responses stay fixed, only the model changes)."""
    from verl.utils.torch_functional import entropy_from_logits

    ent = entropy_from_logits(response_logits(model, batch).float())
    return float(ent[batch.response_mask].double().mean())
