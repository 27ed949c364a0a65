"""Unit tests of the CPU rollout server and adapter (no trainer): sampling settings, log-probs, max tokens,
weight sync through the adapter and Ray's object store."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
import torch

from stapo_verl.cpu import make_assets as M
from stapo_verl.cpu.rollout_server import (
    CPURolloutServer,
    HFGenerator,
    SamplingSettings,
    derive_max_tokens,
    process_logits,
)

PROMPT_LEN, RESP_LEN = 64, 24


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen3 + tokenizer saved to disk (a few seconds; independent of the cached assets)."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny_model")
    rng = random.Random(0)
    probs = [M.make_problem(rng) for _ in range(300)]
    tok = M.build_tokenizer([p["question"] + "\n" + p["solution"] for p in probs], out, vocab_size=300)
    model = M.build_model(tok, hidden=64, layers=2)
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>")]
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return str(out), tok, [M.encode_chat(tok, p["question"]) for p in probs[:6]]


def _server(path, seed=0):
    cfg = {"prompt_length": PROMPT_LEN, "response_length": RESP_LEN, "max_model_len": None, "seed": seed,
           "dtype": "float32"}
    s = CPURolloutServer(config=cfg, model_config={"path": path}, replica_rank=0)
    asyncio.run(s.launch_server())
    return s


def _gen(server, prompts, **params):
    async def run():
        return await asyncio.gather(*[server.generate(prompt_ids=p, sampling_params=dict(params),
                                                      request_id=str(i)) for i, p in enumerate(prompts)])
    return asyncio.run(run())


def test_greedy_is_deterministic_and_returns_global_steps(tiny_model_dir):
    path, _, prompts = tiny_model_dir
    s = _server(path)
    a = _gen(s, prompts, temperature=0, top_p=1.0, top_k=-1, logprobs=False)
    b = _gen(s, prompts, temperature=0, top_p=1.0, top_k=-1, logprobs=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(o.log_probs is None for o in a)
    assert all(o.extra_fields["global_steps"] == 0 and isinstance(o.extra_fields["global_steps"], int) for o in a)
    # concurrent requests were micro-batched, not served one by one
    assert s.num_batches < 2 * len(prompts)


def test_greedy_matches_unbatched_argmax(tiny_model_dir):
    """Batched left-padded generation equals a plain per-prompt argmax loop without KV cache."""
    path, _, prompts = tiny_model_dir
    s = _server(path)
    outs = _gen(s, prompts[:3], temperature=0, logprobs=True, max_tokens=8)
    model = s.generator.model
    for p, o in zip(prompts[:3], outs):
        ids = list(p)
        ref = []
        for _ in range(8):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            t = int(torch.argmax(logits))
            ref.append(t)
            ids.append(t)
            if t in s.generator.eos.tolist():
                break
        assert o.token_ids == ref


def test_temperature_and_top_p_change_outputs(tiny_model_dir):
    path, _, prompts = tiny_model_dir
    greedy = [o.token_ids for o in _gen(_server(path), prompts, temperature=0)]
    hot = [o.token_ids for o in _gen(_server(path, seed=1), prompts, temperature=2.0, top_p=1.0)]
    assert hot != greedy
    # a tiny nucleus keeps only the argmax token at every step: sampling collapses to greedy
    nucleus = [o.token_ids for o in _gen(_server(path, seed=2), prompts, temperature=1.0, top_p=1e-6)]
    assert nucleus == greedy
    topk1 = [o.token_ids for o in _gen(_server(path, seed=3), prompts, temperature=1.5, top_k=1)]
    assert topk1 == greedy


def test_max_tokens_respected(tiny_model_dir):
    path, _, prompts = tiny_model_dir
    s = _server(path)
    outs = _gen(s, prompts, temperature=1.0, max_tokens=3)
    assert all(1 <= len(o.token_ids) <= 3 for o in outs)
    # default derivation (vLLM): min(response_length, prompt_length + response_length - len(prompt))
    outs = _gen(s, prompts, temperature=2.0)
    assert all(len(o.token_ids) <= RESP_LEN for o in outs)
    assert derive_max_tokens(60, PROMPT_LEN, RESP_LEN, None, {}) == RESP_LEN
    assert derive_max_tokens(80, PROMPT_LEN, RESP_LEN, None, {}) == PROMPT_LEN + RESP_LEN - 80
    assert derive_max_tokens(10, PROMPT_LEN, RESP_LEN, None, {"max_tokens": 500}) == PROMPT_LEN + RESP_LEN - 10
    with pytest.raises(ValueError, match="no room"):
        derive_max_tokens(PROMPT_LEN + RESP_LEN, PROMPT_LEN, RESP_LEN, None, {})


def test_logprobs_equal_log_softmax_of_processed_logits(tiny_model_dir):
    path, _, prompts = tiny_model_dir
    s = _server(path, seed=5)
    params = dict(temperature=0.7, top_p=0.9, top_k=20, logprobs=True)
    outs = _gen(s, prompts[:3], **params)
    settings = SamplingSettings.from_params(params)
    model = s.generator.model
    for p, o in zip(prompts[:3], outs):
        assert len(o.log_probs) == len(o.token_ids) > 0
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + o.token_ids])).logits[0]
        proc = process_logits(logits[len(p) - 1: len(p) - 1 + len(o.token_ids)], settings)
        ref = torch.log_softmax(proc, -1).gather(-1, torch.tensor(o.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(o.log_probs), ref, atol=1e-4), (o.log_probs, ref.tolist())
        assert all(lp > float("-inf") for lp in o.log_probs)  # sampled tokens survive the filters


def test_process_logits_filters():
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    k2 = process_logits(x, SamplingSettings(temperature=1.0, top_k=2))
    assert torch.isinf(k2[0, 2:]).all() and torch.isfinite(k2[0, :2]).all()
    p = process_logits(x, SamplingSettings(temperature=1.0, top_p=0.7))  # softmax ≈ .64 .24 .09 .03
    assert torch.isfinite(p[0, :2]).all() and torch.isinf(p[0, 2:]).all()
    t = process_logits(x, SamplingSettings(temperature=2.0))
    assert torch.allclose(t, x / 2)


def test_sampling_settings_errors():
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings.from_params({"temperature": -1})
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings.from_params({"top_p": 0})
    with pytest.raises(ValueError, match="'n'"):
        SamplingSettings.from_params({"n": 4})
    assert SamplingSettings.from_params({"top_k": -1}).top_k == 0


def test_update_weights_rejects_unknown_names(tiny_model_dir):
    path, _, _ = tiny_model_dir
    s = _server(path)
    with pytest.raises(KeyError, match="unknown parameter"):
        asyncio.run(s.update_weights({"nope.weight": torch.zeros(1)}))


@pytest.fixture(scope="module")
def ray_local():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_adapter_weight_sync_changes_outputs(tiny_model_dir, ray_local):
    """Push perturbed weights through the adapter → greedy output changes; push originals → restored."""
    import ray
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from stapo_verl.cpu.rollout_adapter import CPUServerAdapter

    path, _, prompts = tiny_model_dir
    cfg = {"prompt_length": PROMPT_LEN, "response_length": RESP_LEN, "max_model_len": None, "seed": 0,
           "dtype": "float32"}
    server = ray.remote(CPURolloutServer).options(name="cpu_server_0_0", max_concurrency=64).remote(
        config=cfg, model_config={"path": path}, replica_rank=0)
    ray.get(server.launch_server.remote())

    def greedy():
        return [ray.get(server.generate.remote(prompt_ids=p, sampling_params={"temperature": 0, "max_tokens": 12},
                                               request_id=str(i))).token_ids for i, p in enumerate(prompts)]

    os.environ["RANK"], os.environ["RAY_LOCAL_WORLD_SIZE"] = "0", "1"
    rollout_cfg = OmegaConf.create({"name": "cpu", "tensor_model_parallel_size": 1, "data_parallel_size": 1,
                                    "pipeline_model_parallel_size": 1, "free_cache_engine": True})
    adapter = CPUServerAdapter.__new__(CPUServerAdapter)  # skip BaseRollout's dataclass conversion of a stub config
    adapter.config, adapter.model_config, adapter.device_mesh = rollout_cfg, None, None
    adapter.replica_rank, adapter.rollout_rank, adapter.node_rank = 0, 0, 0
    adapter._has_server, adapter.server_handle = True, None

    before = greedy()
    model = AutoModelForCausalLM.from_pretrained(path)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    perturbed["lm_head.weight"] = perturbed["model.embed_tokens.weight"]  # keep the tie consistent
    asyncio.run(adapter.update_weights(iter(perturbed.items()), global_steps=7))
    after = greedy()
    assert after != before
    assert ray.get(server.get_global_steps.remote()) == 7
    out = ray.get(server.generate.remote(prompt_ids=prompts[0], sampling_params={"temperature": 0}, request_id="x"))
    assert out.extra_fields["global_steps"] == 7
    asyncio.run(adapter.update_weights(iter(original.items()), global_steps=8))
    assert greedy() == before
    with pytest.raises(ValueError, match="wire_format"):
        asyncio.run(adapter.update_weights(iter([]), wire_format="delta_flush"))
    ray.kill(server)


# ---------------------------------------------------------------------------------------------------------------
# stop tokens: Qwen3 base models end sequences with <|endoftext|> but turns with <|im_end|>


@pytest.fixture(scope="module")
def base_like_dir(tmp_path_factory):
    """A tiny model dir laid out like Qwen3-Base: tokenizer eos <|endoftext|>, ChatML turns closed by <|im_end|>,
    generation_config eos_token_id = <|endoftext|> only."""
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base_like")
    rng = random.Random(1)
    probs = [M.make_problem(rng) for _ in range(200)]
    tok = M.build_tokenizer([p["question"] + "\n" + p["solution"] for p in probs], out, vocab_size=300)
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(str(out))
    model = M.build_model(tok, hidden=64, layers=2)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    return str(out), tok, [M.encode_chat(tok, p["question"]) for p in probs[:3]]


def _server_with(path, generation_config=None):
    cfg = {"prompt_length": PROMPT_LEN, "response_length": RESP_LEN, "max_model_len": None, "seed": 0,
           "dtype": "float32", "engine_kwargs": {"vllm": {"generation_config": generation_config}}}
    s = CPURolloutServer(config=cfg, model_config={"path": path}, replica_rank=0)
    asyncio.run(s.launch_server())
    return s


def test_stop_tokens_come_from_the_models_own_files(base_like_dir):
    from stapo_verl.eval.generate_vllm import sampling_stop_kwargs
    from stapo_verl.stop_tokens import end_of_turn_token_id, resolve

    path, tok, _ = base_like_dir
    endoftext, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    assert endoftext != im_end and tok.eos_token_id == endoftext
    assert end_of_turn_token_id(tok) == im_end  # found by rendering the chat template, not by name
    stop = resolve(path)
    assert stop.eos_token_id == endoftext and stop.generation_eos_ids == (endoftext,)
    assert stop.ids == tuple(sorted((endoftext, im_end)))
    assert stop.describe() == f"{list(stop.ids)} ({', '.join(tok.convert_ids_to_tokens(list(stop.ids)))})"
    # the offline evaluation (generate_vllm) stops at the same ids
    assert sampling_stop_kwargs(stop) == {"stop_token_ids": list(stop.ids)}


def test_server_stops_where_the_vllm_generation_config_setting_says(base_like_dir, tmp_path):
    from stapo_verl.stop_tokens import write_generation_config

    path, tok, prompts = base_like_dir
    endoftext, im_end = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    # vLLM semantics of engine_kwargs.vllm.generation_config: unset/'auto' = the model's, 'vllm' = none
    assert _server_with(path).stop_token_ids == [endoftext]
    assert _server_with(path, "auto").stop_token_ids == [endoftext]
    assert _server_with(path, "vllm").stop_token_ids == [endoftext]
    folder = tmp_path / "gen_cfg"
    write_generation_config(path, str(folder))
    s = _server_with(path, str(folder))
    assert s.stop_token_ids == sorted((endoftext, im_end))
    assert sorted(s.generator.eos.tolist()) == sorted((endoftext, im_end))  # what the sampler stops at
    with pytest.raises(FileNotFoundError, match="engine_kwargs.vllm.generation_config="):
        _server_with(path, str(tmp_path / "missing"))


def test_generation_ends_at_an_id_of_the_configured_generation_config(base_like_dir, tmp_path):
    """The ids of the folder reach the sampling loop: greedy output stops at the first configured id."""
    import json

    path, _, prompts = base_like_dir
    plain = _gen(_server_with(path), prompts[:1], temperature=0, max_tokens=8)[0].token_ids
    assert len(plain) == 8  # the random model does not hit <|endoftext|> in 8 greedy tokens
    folder = tmp_path / "stop_at_first"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [plain[2]]}))
    stopped = _gen(_server_with(path, str(folder)), prompts[:1], temperature=0, max_tokens=8)[0].token_ids
    first = plain.index(plain[2])
    assert stopped == plain[: first + 1]  # the stop token is included, as vLLM returns it


def test_seeded_request_samples_the_same_whatever_its_batch(tiny_model_dir):
    """A request with a seed samples a function of (prompt, seed, weights): alone, in a batch of 6 in another order,
    in a batch of 40 (two blocks, the second filled with dummy rows; the request first, then at row 30) and in a
    batch of 3 (one block, mostly dummy rows), tokens and log-probs are bit-identical. Unseeded, the same request
    in a batch draws from the shared generator (what vLLM does without a seed)."""
    path, tok, prompts = tiny_model_dir
    s = _server(path)
    settings = SamplingSettings(temperature=1.0, logprobs=True)
    gen = s.generator
    assert gen.pad_to == PROMPT_LEN and gen.block_rows == HFGenerator.BLOCK_ROWS
    alone = gen.generate(prompts[:1], [RESP_LEN], settings, [1234])[0]
    many = (prompts * 7)[:40]
    batch_40 = gen.generate(many, [RESP_LEN] * 40, settings, list(range(100, 140)))
    in_40 = gen.generate(many, [RESP_LEN] * 40, settings, [1234] + list(range(39)))[0]
    at_30 = gen.generate(many, [RESP_LEN] * 40, settings, list(range(30)) + [1234] + list(range(9)))[30]
    in_6 = gen.generate(prompts[::-1], [RESP_LEN] * 6, settings, [5, 4, 3, 2, 1, 1234])[-1]
    in_3 = gen.generate([prompts[2], prompts[0], prompts[1]], [RESP_LEN, 7, RESP_LEN], settings, [9, 1234, 8])[1]
    assert in_40 == alone and in_6 == alone and at_30 == alone
    assert in_3[0] == alone[0][:7] and in_3[1] == alone[1][:7]  # same draws, cut at its own limit
    # every request of the batch of 40 equals the same request served alone
    assert all(gen.generate([p], [RESP_LEN], settings, [100 + i])[0] == batch_40[i] for i, p in enumerate(many))
    # the same seed twice in one batch: the same response; another seed: another one (for this prompt and model)
    twice = gen.generate([prompts[0], prompts[0], prompts[0]], [RESP_LEN] * 3, settings, [1234, 1234, 99])
    assert twice[0] == twice[1] == alone and twice[2][0] != alone[0]


def _shapes_seen(gen, n_requests, prompts, settings):
    """The ``(input_ids, attention_mask, KV length)`` shapes of every forward call of ``gen`` for ``n_requests``
    concurrent requests, recorded with a forward pre-hook on the model."""
    seen = []

    def hook(_module, _args, kwargs):
        past = kwargs.get("past_key_values")
        seen.append((tuple(kwargs["input_ids"].shape), tuple(kwargs["attention_mask"].shape),
                     0 if past is None else past.get_seq_length()))

    handle = gen.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        gen.generate((prompts * 50)[:n_requests], [RESP_LEN] * n_requests, settings, list(range(n_requests)))
    finally:
        handle.remove()
    return seen


def test_the_model_sees_the_same_shapes_whatever_the_number_of_requests(tiny_model_dir):
    """Batch invariance by construction, so it cannot depend on the CPU's kernels: for 1, 3, 8, 9, 40 and 100
    concurrent requests, every model call has ``block_rows`` rows and the prompt is padded to ``prompt_length``;
    a block's t-th call has the same shapes whichever block and batch it belongs to. With ``block_rows=0`` (one
    block per call) the row count follows the batch, which is what the blocks remove."""
    path, _, prompts = tiny_model_dir
    gen = _server(path).generator
    settings = SamplingSettings(temperature=1.0, logprobs=True)
    R = gen.block_rows
    canonical = [((R, PROMPT_LEN), (R, PROMPT_LEN), 0)] + [((R, 1), (R, PROMPT_LEN + t), PROMPT_LEN + t - 1)
                                                          for t in range(1, RESP_LEN)]
    for n in (1, 3, 8, 9, 40, 100):
        seen = _shapes_seen(gen, n, prompts, settings)
        starts = [i for i, call in enumerate(seen) if call[2] == 0]  # a block starts with an empty KV cache
        assert len(starts) == -(-n // R), (n, starts)
        for a, b in zip(starts, starts[1:] + [len(seen)]):
            assert 1 <= b - a <= RESP_LEN and seen[a:b] == canonical[: b - a], (n, seen[a:b])
    one_block = HFGenerator(gen.model, sorted(gen.eos.tolist()), gen.pad_token_id, pad_to=PROMPT_LEN, block_rows=0)
    assert {_shapes_seen(one_block, n, prompts, settings)[0][0][0] for n in (1, 3, 40)} == {1, 3, 40}
    with pytest.raises(ValueError, match="block_rows=-1"):
        HFGenerator(gen.model, [0], 0, block_rows=-1)


def test_server_honours_the_request_seed(tiny_model_dir):
    path, _, prompts = tiny_model_dir
    s = _server(path, seed=0)
    s2 = _server(path, seed=7)  # another server seed: seeded requests do not depend on it
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True)
    a = asyncio.run(s.generate(prompt_ids=prompts[0], sampling_params={**params, "seed": 42}, request_id="a"))
    b = _gen(s2, [prompts[1], prompts[0], prompts[2]], **params, seed=42)[1]
    assert (a.token_ids, a.log_probs) == (b.token_ids, b.log_probs)
    for bad in (-1, 2**63, 1.5, "3", True):
        with pytest.raises(ValueError, match="sampling_params\\['seed'\\]"):
            asyncio.run(s.generate(prompt_ids=prompts[0], sampling_params={**params, "seed": bad}, request_id="x"))


def test_requests_handed_over_one_at_a_time_fill_whole_blocks_and_sample_as_alone(tiny_model_dir):
    """Requests that arrive one at a time (5 ms apart, as verl's agent loop hands them over) are decoded in whole
    blocks: 40 requests make one full block of 32 and, once no request has arrived for ``IDLE_GAP_S``, one block of
    8 (24 dummy rows, where decoding what arrived within a short window ran up to 40 blocks). Each request's tokens
    and log-probs equal the same request served alone (one real row and 31 dummy rows)."""
    path, _, prompts = tiny_model_dir
    many = (prompts * 7)[:40]
    s = _server(path)
    s.IDLE_GAP_S = 2.0  # far above the 5 ms between requests, also on a loaded machine
    params = dict(temperature=1.0, logprobs=True)

    async def one_at_a_time():
        async def one(i, p):
            await asyncio.sleep(0.005 * i)
            return await s.generate(prompt_ids=p, sampling_params={**params, "seed": 500 + i}, request_id=str(i))
        return await asyncio.gather(*[one(i, p) for i, p in enumerate(many)])

    _gen(s, prompts[:1], **params, seed=1)  # the first request's imports take longer than the 40 arrivals
    before = asyncio.run(s.get_stats())
    outs = asyncio.run(one_at_a_time())
    stats = {k: v - before[k] for k, v in asyncio.run(s.get_stats()).items()}
    assert (stats["num_requests"], stats["num_batches"], stats["num_blocks"]) == (40, 2, 2)
    assert (stats["real_rows"], stats["padding_rows"]) == (40, 24)
    alone = _server(path)
    for i in (0, 17, 31, 39):  # from the full block (first, middle, last row) and from the partial one
        a = asyncio.run(alone.generate(prompt_ids=many[i], sampling_params={**params, "seed": 500 + i},
                                       request_id="alone"))
        assert (a.token_ids, a.log_probs) == (outs[i].token_ids, outs[i].log_probs), i
        assert len(a.token_ids) >= 1
    alone_stats = asyncio.run(alone.get_stats())
    assert (alone_stats["num_blocks"], alone_stats["real_rows"], alone_stats["padding_rows"]) == (4, 4, 124)


def test_a_settings_group_that_fills_a_block_goes_first_and_the_rest_waits(tiny_model_dir):
    """The queue policy alone (``CPURolloutServer._take``): whole blocks of the first group that fills one, at most
    ``MAX_BATCH`` requests; a partial group only once idle."""
    path, _, prompts = tiny_model_dir
    s = _server(path)
    R = s.generator.block_rows
    hot, greedy = SamplingSettings(temperature=1.0), SamplingSettings(temperature=0.0)
    s._pending = ([(prompts[0], 4, greedy, None, k) for k in range(5)]
                  + [(prompts[0], 4, hot, k, k) for k in range(R - 1)])
    assert s._take(idle=False) == [] and len(s._pending) == R + 4  # no group fills a block: all wait
    s._pending += [(prompts[0], 4, hot, k, k) for k in range(R - 1, R + 3)]
    full = s._take(idle=False)
    assert [i[3] for i in full] == list(range(R)) and all(i[2] == hot for i in full)
    assert s._take(idle=False) == []
    assert [i[2] for i in s._take(idle=True)] == [greedy] * 5  # the first group by arrival, when idle
    assert [i[3] for i in s._take(idle=True)] == [R, R + 1, R + 2]
    assert s._pending == []
    s._pending = [(prompts[0], 4, hot, k, k) for k in range(s.MAX_BATCH + 2 * R + 1)]
    assert len(s._take(idle=False)) == s.MAX_BATCH and len(s._take(idle=False)) == 2 * R
    assert len(s._take(idle=True)) == 1
