"""The tiny assets the recipe trains on, built for real once (about a minute on one core): Qwen3-Base's stop
situation (eos <|endoftext|>, turns end with <|im_end|>) and the warm start's regime."""

from __future__ import annotations

import json
import re

import pytest

from stapo_verl.cpu import make_assets as M


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One full build with the shipped settings (the one the recipe uses; under a minute on an idle core)."""
    out = tmp_path_factory.mktemp("tiny_assets")
    m = M.build(out)
    print(f"\nmake_assets build: {m['build_seconds']} s (warm start {m['sft_seconds']} s)")
    return out, m


def _greedy_responses(model_dir, stop_ids, n=64):
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True).eval()
    rows = pd.read_parquet(model_dir.parent / "data" / "val.parquet").head(n)
    prompts = [M.encode_chat(tok, r["prompt"][0]["content"]) for _, r in rows.iterrows()]
    gen = HFGenerator(model, stop_ids, tok.pad_token_id, seed=0)
    outs = gen.generate(prompts, [40] * len(prompts), SamplingSettings(temperature=0.0, top_p=1.0, top_k=0,
                                                                        logprobs=False))
    return tok, [ids for ids, _ in outs], [r["reward_model"]["ground_truth"] for _, r in rows.iterrows()]


def test_built_assets_end_sequences_and_turns_like_qwen3_base(built):
    """eos (tokenizer, config.json, generation_config.json) is <|endoftext|>, turns end with <|im_end|>; a rollout
    stopping at the eos alone runs past the answer, one stopping at both ends the turn."""
    from stapo_verl.stop_tokens import effective_stop_ids, resolve

    out, m = built
    model_dir = out / "model"
    cfg = json.loads((model_dir / "config.json").read_text())
    gen_cfg = json.loads((model_dir / "generation_config.json").read_text())
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    stop = resolve(str(model_dir))
    eot, eos = stop.end_of_turn_id, stop.eos_token_id
    assert stop.tokens[eot] == "<|im_end|>" and stop.tokens[eos] == "<|endoftext|>" and eot != eos
    assert tok_cfg["eos_token"] == "<|endoftext|>" and cfg["eos_token_id"] == eos and gen_cfg["eos_token_id"] == eos
    assert effective_stop_ids(str(model_dir), None) == [eos]  # the model's own files never stop at <|im_end|>

    tok, runaway, gts = _greedy_responses(model_dir, [eos])
    tok, stopped, _ = _greedy_responses(model_dir, sorted({eos, eot}))
    # with both stops every greedy answer ends its turn right after the box, and nearly all are right
    assert all(ids[-1] == eot for ids in stopped)
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in stopped]
    assert all(re.fullmatch(r".*\\boxed\{\d+\}", t) for t in texts), texts[:4]
    assert sum(t.endswith(f"\\boxed{{{gt}}}") for t, gt in zip(texts, gts)) >= 0.9 * len(texts), texts[:4]
    # with the eos alone the same answers run on into a new, invented turn, up to the length limit, and often
    # box another (invented) answer: the strict scorer reads the last box
    for a, b in zip(stopped, runaway):
        assert b[:len(a)] == a and len(b) == 40
        assert tok.decode(b[len(a):len(a) + 4]).startswith("\n<|im_start|>user"), tok.decode(b)


def test_warm_start_leaves_room_for_rl(built):
    """The warm start knows the answers (greedy) but samples stray tokens at T = 1 (the RL regime the tiny run
    needs), and the manifest records what the recipe reads."""
    out, m = built
    assert m["version"] == M.ASSET_VERSION and m["n_val"] == M.N_VAL and m["sft_steps"] == M.SFT["steps"]
    assert m["greedy_acc"] >= 0.9 and 0.3 <= m["sampled_acc"] <= 0.75 and m["greedy_acc"] - m["sampled_acc"] >= 0.2
    import pandas as pd

    val = pd.read_parquet(m["val_file"])
    train = pd.read_parquet(m["train_file"])
    assert len(val) == M.N_VAL and len(train) == m["n_train"]
    qs = lambda df: {r[0]["content"] for r in df["prompt"]}  # noqa: E731
    assert not qs(val) & qs(train)  # validation questions are never trained on
    assert m["n_params"] < 1_000_000
    # validation is the synthetic rows only: no file outside the asset directory, nothing downloaded
    assert set(val["data_source"]) == {"math_dapo"} and "benchmark_val_files" not in m
