"""Tiny-asset builders: problem generator, tokenizer (chat template, byte fallback), manifest caching."""

from __future__ import annotations

import json
import random
import re

from stapo_verl.cpu import make_assets as M


def test_problems_are_consistent_and_boxed():
    rng = random.Random(0)
    for _ in range(500):
        p = M.make_problem(rng)
        steps = re.findall(r"(\d+)([+\-*])(\d+)=(\d+)", p["solution"])
        assert steps, p
        for a, op, b, c in steps:  # every worked step is correct arithmetic
            assert eval(f"{a}{op}{b}") == int(c), p
        assert p["solution"].endswith(f"\\boxed{{{p['answer']}}}") and int(p["answer"]) >= 0
        row = M.verl_row(p, "train", 3)
        assert row["data_source"] == "math_dapo" and row["reward_model"]["ground_truth"] == p["answer"]
        assert row["prompt"] == [{"role": "user", "content": p["question"]}]


def test_tokenizer_chat_template_and_byte_fallback(tmp_path):
    rng = random.Random(1)
    corpus = [(lambda p: p["question"] + "\n" + p["solution"])(M.make_problem(rng)) for _ in range(200)]
    tok = M.build_tokenizer(corpus, tmp_path, vocab_size=300)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert len(tok.encode("\n", add_special_tokens=False)) == 1  # verl's Qwen builder requires this
    ids = M.encode_chat(tok, "What is 2+3?")
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    text = "Janet’s ducks lay 16 eggs; $\\frac{\\pi}{2}$ — ünïcode ✓"  # unseen chars: byte-level fallback
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_ids_to_tokens(tok.encode("1234", add_special_tokens=False)) == ["1", "2", "3", "4"]


def test_build_returns_cached_manifest_instantly(tmp_path):
    manifest = {"version": M.ASSET_VERSION, "n_train": 1, "benchmark_val_files": ["a", "b"], "marker": 42}
    (tmp_path / "assets.json").write_text(json.dumps(manifest))
    assert M.build(tmp_path)["marker"] == 42
    assert not (tmp_path / "model").exists()  # the manifest matched: nothing was rebuilt
