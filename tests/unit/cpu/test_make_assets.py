"""Tiny-asset builders, in process: problem generator, tokenizer (chat template, byte fallback), manifest caching, the
lines the recipe reads (tests/integration/cpu/test_tiny_assets.py builds the real assets)."""

from __future__ import annotations

import json
import random
import re

import pytest

from stapo_verl.cpu import make_assets as M


def test_problems_are_consistent_and_boxed():
    rng = random.Random(0)
    for _ in range(500):
        p = M.make_problem(rng)
        steps = re.findall(r"(\d+)([+\-*])(\d+)=(\d+)", p["solution"])
        assert len(steps) == 2, p
        for a, op, b, c in steps:  # every worked step is correct, non-negative arithmetic
            assert eval(f"{a}{op}{b}") == int(c) >= 0, p
        assert steps[1][0] == steps[0][3]  # the second step starts from the first result
        assert all(1 <= int(x) <= 9 for x in re.findall(r"\d+", p["question"])), p  # single-digit operands
        assert p["solution"].endswith(f"\\boxed{{{p['answer']}}}") and p["answer"] == steps[1][3]
        row = M.verl_row(p, "train", 3)
        assert row["data_source"] == "math_dapo" and row["reward_model"]["ground_truth"] == p["answer"]
        assert row["prompt"] == [{"role": "user", "content": p["question"]}]


def test_tokenizer_chat_template_and_byte_fallback(tmp_path):
    rng = random.Random(1)
    corpus = [(lambda p: p["question"] + "\n" + p["solution"])(M.make_problem(rng)) for _ in range(200)]
    tok = M.build_tokenizer(corpus, tmp_path, vocab_size=300)
    # Qwen3-Base: end of sequence <|endoftext|> (also the pad), the chat template ends turns with <|im_end|>
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    assert len(tok.encode("\n", add_special_tokens=False)) == 1  # verl's Qwen builder requires this
    ids = M.encode_chat(tok, "What is 2+3?")
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    text = "Janet’s ducks lay 16 eggs; $\\frac{\\pi}{2}$ — ünïcode ✓"  # unseen chars: byte-level fallback
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.convert_ids_to_tokens(tok.encode("1234", add_special_tokens=False)) == ["1", "2", "3", "4"]


def _cached(tmp_path, **extra) -> dict:
    manifest = {"version": M.ASSET_VERSION, "n_train": 4000, "n_val": 640, "n_params": 367920, "sampled_acc": 0.52,
                "greedy_acc": 0.99, "build_seconds": 66.0, "model_dir": str(tmp_path / "model"),
                "train_file": str(tmp_path / "data" / "train.parquet"),
                "val_file": str(tmp_path / "data" / "val.parquet"), **extra}
    (tmp_path / "assets.json").write_text(json.dumps(manifest))
    return manifest


def test_build_returns_cached_manifest_instantly(tmp_path):
    _cached(tmp_path, marker=42)
    assert M.build(tmp_path)["marker"] == 42
    assert not (tmp_path / "model").exists()  # the manifest matched: nothing was rebuilt


def test_recipe_vars_are_the_three_lines_the_recipe_reads(tmp_path, capsys):
    """stdout is exactly model dir, train file, validation list (Hydra-quoted); progress goes to stderr only.
    A manifest of an earlier build that still lists benchmark files validates on the synthetic rows only."""
    m = _cached(tmp_path, benchmark_val_files=["/old/gsm8k_val.parquet"])
    assert M.main(["--out", str(tmp_path), "--print-recipe-vars"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [m["model_dir"], repr(m["train_file"]), f"[{m['val_file']!r}]"]
    assert "{" not in err and "640 validation rows" in err  # one progress line, no manifest dump




def test_the_cached_set_of_another_head_dim_is_refused_by_name(tmp_path):
    """The vLLM asset set (head_dim 32) and the default one (24) never stand in for each other; a manifest written
    before head_dim was recorded is the default set."""
    _cached(tmp_path)  # no "head_dim" key: an earlier build of the default set
    assert M.build(tmp_path, head_dim=M.DEFAULT_HEAD_DIM)["version"] == M.ASSET_VERSION
    with pytest.raises(ValueError, match=r"head_dim=24, asked for head_dim=32: .*--force"):
        M.build(tmp_path, head_dim=M.VLLM_HEAD_DIM)
    _cached(tmp_path, head_dim=M.VLLM_HEAD_DIM)
    assert M.build(tmp_path, head_dim=M.VLLM_HEAD_DIM)["head_dim"] == 32



def test_a_second_builder_waits_for_the_first_and_returns_its_manifest(tmp_path, monkeypatch):
    """Two jobs on an empty cache: the second waits on the directory's lock (held here by "the first"), then reads
    the manifest the first wrote instead of building into the same directory."""
    import fcntl
    import threading

    out, got, calls = tmp_path / "tiny", {}, []
    real = M._build
    monkeypatch.setattr(M, "_build", lambda *a: calls.append(a[0]) or real(*a))
    with open(tmp_path / ".tiny.lock", "a") as held:  # the lock build_lock takes, held by another open file
        fcntl.flock(held, fcntl.LOCK_EX)
        second = threading.Thread(target=lambda: got.setdefault("m", M.build(out)), daemon=True)
        second.start()
        second.join(1.0)
        assert second.is_alive() and calls == []  # waiting on the lock, not reading or building
        out.mkdir()
        _cached(out, marker=7)  # what the first builder leaves
        fcntl.flock(held, fcntl.LOCK_UN)
    second.join(30)
    assert not second.is_alive() and calls == [out] and got["m"]["marker"] == 7
    assert not (out / "model").exists()  # the first one's manifest, nothing built again
