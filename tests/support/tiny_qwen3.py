"""Tiny Qwen3 model and a verl no-padding (nested) mini-batch built in-process (no downloads)."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from transformers import Qwen3Config, Qwen3ForCausalLM
from verl.utils import tensordict_utils as tu
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

VOCAB = 64


def tiny_qwen3(seed: int = 0, vocab: int = VOCAB) -> Qwen3ForCausalLM:
    """A 2-layer Qwen3 (hidden 32) in fp32 with SDPA attention."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen3ForCausalLM(cfg).float()


def sequence_outputs(model, seqs: list[torch.Tensor], grad: bool):
    """Per-sequence log-prob of the next token and entropy, packed as verl's nested full-sequence outputs.

    Position i holds log p(ids[i+1] | ids[≤i]) (verl's convention, sliced by ``no_padding_2_padding``).
    """
    lps, ents = [], []
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        for ids in seqs:
            logits = model(input_ids=ids[None]).logits[0]
            labels = torch.roll(ids, -1)
            lps.append(logprobs_from_logits(logits, labels))
            ents.append(entropy_from_logits(logits))
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    return nest(lps), nest(ents)


def make_minibatch(model, bs=4, seed=1, adv_values=(1.5, -0.8, 0.7, 1.1)):
    """verl-style mini-batch: nested prompts/responses/masks + old log-probs/entropy from a no-grad pass."""
    from verl.workers.utils.padding import response_from_nested

    g = torch.Generator().manual_seed(seed)
    prompts, responses, seqs = [], [], []
    for _ in range(bs):
        p = torch.randint(0, VOCAB, (int(torch.randint(3, 6, (1,), generator=g)),), generator=g)
        r = torch.randint(0, VOCAB, (int(torch.randint(4, 8, (1,), generator=g)),), generator=g)
        prompts.append(p)
        responses.append(r)
        seqs.append(torch.cat([p, r]))
    nest = lambda xs: torch.nested.as_nested_tensor(xs, layout=torch.jagged)  # noqa: E731
    rmask = nest([torch.ones(len(r), dtype=torch.int64) for r in responses])
    old_lp, old_ent = sequence_outputs(model, seqs, grad=False)
    adv = nest([torch.full((len(r),), float(adv_values[i % len(adv_values)])) for i, r in enumerate(responses)])
    td = TensorDict(
        {
            "prompts": nest(prompts),
            "responses": nest(responses),
            "response_mask": rmask,
            "loss_mask": rmask.clone(),
            "old_log_probs": response_from_nested(old_lp, rmask),
            "entropy": response_from_nested(old_ent, rmask),
            "advantages": adv,
        },
        batch_size=[bs],
    )
    return td, seqs


def set_engine_info(td, dp_size=1):
    """What the engine assigns before the micro-batch loop (``forward_backward_batch``)."""
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=int(td["loss_mask"].values().sum()),
                         global_batch_size=td.batch_size[0])
