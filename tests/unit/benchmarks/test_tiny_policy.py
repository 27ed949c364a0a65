"""The benchmarks' in-process tiny policy (``benchmarks/tiny_policy.py``): GRPO advantages against the closed form,
response-position alignment of the batched forward, and loading a tiny run's actor checkpoint."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support.bench_modules import benchmark_module

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tp():
    with benchmark_module("tiny_policy") as module:
        yield module


def _model(seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=23, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8, max_position_embeddings=64, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg).eval()


def _batch(tp, prompts, responses, pad=0):
    B, T = len(prompts), max(len(r) for r in responses)
    L = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids, att = torch.full((B, L), pad), torch.zeros((B, L), dtype=torch.long)
    resp, mask = torch.full((B, T), pad), torch.zeros((B, T), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        att[i, :len(p) + len(r)] = 1
        resp[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = True
    return tp.Batch(input_ids=ids, attention_mask=att, prompt_len=torch.tensor([len(p) for p in prompts]),
                    responses=resp, response_mask=mask, scores=torch.zeros(B), uid=np.array(["a"] * B, dtype=object))


def test_grpo_advantages_closed_form(tp):
    b = _batch(tp, [[1, 2]] * 4, [[3, 4, 5], [3], [6, 7], [8, 9, 10]])
    b.scores = torch.tensor([1.0, -1.0, 1.0, 1.0])
    b.uid = np.array(["a", "a", "b", "b"], dtype=object)
    adv = tp.grpo_advantages(b)
    # group a: mean 0, unbiased std sqrt(2) -> ±1/sqrt(2); group b: identical scores -> 0; 0 on padding
    s = 1 / (math.sqrt(2) + 1e-6)
    expected = torch.tensor([[s, s, s], [-s, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_batched_response_log_prob_equals_one_row_at_a_time(tp):
    model = _model(0)
    prompts, responses = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [[10, 11], [12, 13, 14, 15], [16]]
    b = _batch(tp, prompts, responses)
    with torch.no_grad():
        lp = tp.response_log_prob(tp.response_logits(model, b), b)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            logits = model(input_ids=torch.tensor([p + r])).logits[0]
            ref = torch.log_softmax(logits[len(p) - 1:len(p) + len(r) - 1], -1).gather(-1, torch.tensor(r)[:, None])
            torch.testing.assert_close(lp[i, :len(r)], ref.squeeze(-1), rtol=1e-5, atol=1e-5)


def test_load_actor_checkpoint_round_trip_and_key_check(tp, tmp_path):
    src, dst = _model(1), _model(2)
    state = {k: v for k, v in src.state_dict().items() if k != "lm_head.weight"}  # tied: verl saves no lm_head
    torch.save(state, tmp_path / "model_world_size_1_rank_0.pt")
    tp.load_actor_checkpoint(dst, tmp_path)
    for k, v in src.state_dict().items():
        torch.testing.assert_close(dst.state_dict()[k], v, rtol=0, atol=0)
    del state["model.norm.weight"]
    torch.save(state, tmp_path / "model_world_size_1_rank_0.pt")
    with pytest.raises(ValueError, match="model.norm.weight"):
        tp.load_actor_checkpoint(_model(3), tmp_path)
    with pytest.raises(FileNotFoundError):
        tp.load_actor_checkpoint(dst, tmp_path / "nowhere")
