"""Build (once, cached) the tiny assets of the CPU run: tokenizer, Qwen3 model, synthetic data, benchmark slice.

Usage::

    python -m stapo_verl.cpu.make_assets [--out DIR] [--force]

``DIR`` defaults to ``$STAPO_ASSETS`` or ``~/.cache/stapo_verl/tiny``. Layout::

    DIR/model/            HF Qwen3ForCausalLM + tokenizer (ByteLevel BPE, Qwen ChatML template, EOS <|im_end|>)
    DIR/data/train.parquet, DIR/data/val.parquet          synthetic multi-step arithmetic (verl schema)
    DIR/data/gsm8k_val.parquet, DIR/data/math500_val.parquet   real rows via `python -m stapo_verl.data.prepare`
    DIR/assets.json       manifest: sizes, SFT steps, warm-start sampled accuracy, seed; its presence = done

Everything is seeded; a second call returns immediately when the manifest matches :data:`ASSET_VERSION`.
The model is warm-started with a short plain-torch supervised pass and stopped as soon as its *sampled*
(temperature :data:`SAMPLE_TEMPERATURE`) validation accuracy reaches :data:`TARGET_ACC`, so that RL sees
groups with both right and wrong answers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ASSET_VERSION = 3
SEED = 1234
SAMPLE_TEMPERATURE = 1.0
TARGET_ACC = 0.35  # stop the warm start once sampled val accuracy reaches this (band asked: 20-60%)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NAMES = ["Ann", "Bob", "Cara", "Dan", "Eve", "Finn", "Gia", "Hal", "Ivy", "Jon", "Kim", "Leo"]
ITEMS = ["apples", "books", "coins", "cards", "pens", "shells", "stamps", "marbles"]


def default_dir() -> Path:
    """``$STAPO_ASSETS`` or ``~/.cache/stapo_verl/tiny``."""
    return Path(os.environ.get("STAPO_ASSETS") or Path.home() / ".cache" / "stapo_verl" / "tiny")


# ----------------------------------------------------------------------------- synthetic problems
def default_data_src() -> Path:
    """Published benchmark files: ``$STAPO_DATA_SRC``, else ``<repo>/../shared/data`` (the project's layout)."""
    env = os.environ.get("STAPO_DATA_SRC")
    return Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"


def make_problem(rng: random.Random) -> dict:
    """One multi-step arithmetic word problem.

    Returns:
        dict with ``question`` (str), ``solution`` (worked steps ending in ``\\boxed{answer}``) and
        ``answer`` (str of a non-negative int).
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(4)
    if kind == 0:  # a + b - c
        a, b = rng.randint(10, 60), rng.randint(10, 60)
        c = rng.randint(2, a + b - 1)
        s1, s2 = a + b, a + b - c
        q = f"{name} has {a} {item}. {name} gets {b} more, then gives away {c}. How many {item} are left?"
        steps = f"{a}+{b}={s1}. {s1}-{c}={s2}."
    elif kind == 1:  # a * b - c
        a, b = rng.randint(3, 12), rng.randint(3, 12)
        c = rng.randint(1, a * b - 1)
        s1, s2 = a * b, a * b - c
        q = f"{name} buys {a} boxes with {b} {item} each and loses {c}. How many {item} are left?"
        steps = f"{a}*{b}={s1}. {s1}-{c}={s2}."
    elif kind == 2:  # (a + b) * c
        a, b, c = rng.randint(2, 15), rng.randint(2, 15), rng.randint(2, 9)
        s1, s2 = a + b, (a + b) * c
        q = f"{name} packs {a} red and {b} blue {item} in each bag. How many {item} are in {c} bags?"
        steps = f"{a}+{b}={s1}. {s1}*{c}={s2}."
    else:  # a * b + c * d
        a, b, c, d = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 9)
        s1, s2, s3 = a * b, c * d, a * b + c * d
        q = f"{name} has {a} rows of {b} {item} and {c} rows of {d} {item}. How many {item} in total?"
        steps = f"{a}*{b}={s1}. {c}*{d}={s2}. {s1}+{s2}={s3}."
        s2 = s3
    return {"question": q, "solution": f"{steps} \\boxed{{{s2}}}", "answer": str(s2)}


def verl_row(p: dict, split: str, index: int) -> dict:
    """verl parquet schema row (``data_source``, chat ``prompt``, ``ability``, ``reward_model``, ``extra_info``)."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": p["question"]}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": p["answer"]},
        "extra_info": {"split": split, "index": index, "solution": p["solution"]},
    }


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer(corpus: list[str], out: Path, vocab_size: int = 384):
    """Train a byte-level BPE (digits split individually, like Qwen) and save it as an HF fast tokenizer.

    Byte-level means any UTF-8 text encodes (real benchmark rows included). Returns the loaded tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 bos_token=None, unk_token=None)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(out), local_files_only=True)


def encode_chat(tok, question: str) -> list[int]:
    """Prompt ids exactly as verl's Qwen builder renders them (chat template + generation prompt)."""
    ids = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


# ----------------------------------------------------------------------------- model + warm start
def build_model(tok, hidden: int = 128, layers: int = 4):
    """A small random ``Qwen3ForCausalLM`` (tied embeddings, fp32) for ``tok``'s vocabulary."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id, rope_theta=10000.0, torch_dtype="float32",
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(cfg)


def sampled_accuracy(model, tok, problems: list[dict], temperature: float, max_tokens: int = 48,
                     seed: int = 0) -> float:
    """Fraction of ``problems`` whose sampled answer's last ``\\boxed{}`` equals the ground truth."""
    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings
    from stapo_verl.rewards.dapo import extract_boxed_answer

    gen = HFGenerator(model, [tok.eos_token_id], tok.pad_token_id, seed=seed)
    s = SamplingSettings(temperature=temperature, top_p=1.0, top_k=0, logprobs=False)
    prompts = [encode_chat(tok, p["question"]) for p in problems]
    correct = 0
    for i in range(0, len(prompts), 64):
        outs = gen.generate(prompts[i:i + 64], [max_tokens] * len(prompts[i:i + 64]), s)
        for (ids, _), p in zip(outs, problems[i:i + 64]):
            text = tok.decode(ids, skip_special_tokens=True)
            correct += int((extract_boxed_answer(text, tail_chars=None) or "").strip() == p["answer"])
    return correct / max(1, len(problems))


def warm_start(model, tok, train: list[dict], val: list[dict], max_steps: int = 3000, batch: int = 32,
               lr: float = 2e-3, eval_every: int = 100, log=print) -> dict:
    """Supervised pass on ``prompt + solution + <|im_end|>`` (loss on the response only, AdamW).

    Stops at the first evaluation whose sampled accuracy (``SAMPLE_TEMPERATURE``, 128 val problems)
    reaches :data:`TARGET_ACC`, or at ``max_steps``.

    Returns:
        dict ``{"sft_steps", "sampled_acc", "greedy_acc", "history"}``.
    """
    import torch

    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    enc = []
    for p in train:
        pr = encode_chat(tok, p["question"])
        resp = tok.encode(p["solution"], add_special_tokens=False) + [eos]
        enc.append((pr, resp))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    history, acc, step = [], 0.0, 0
    val_eval = val[:128]
    while step < max_steps:
        model.train()
        idx = rng.sample(range(len(enc)), batch)
        seqs = [enc[i][0] + enc[i][1] for i in idx]
        L = max(len(s) for s in seqs)
        ids = torch.full((batch, L), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, L), -100, dtype=torch.long)
        att = torch.zeros((batch, L), dtype=torch.long)
        for r, i in enumerate(idx):
            pr, resp = enc[i]
            n = len(pr) + len(resp)
            ids[r, :n] = torch.tensor(pr + resp)
            labels[r, len(pr):n] = torch.tensor(resp)
            att[r, :n] = 1
        out = model(input_ids=ids, attention_mask=att, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % eval_every == 0:
            model.eval()
            acc = sampled_accuracy(model, tok, val_eval, SAMPLE_TEMPERATURE, seed=step)
            history.append({"step": step, "loss": float(out.loss.detach()), "sampled_acc": acc})
            log(f"[make_assets] sft step {step} loss {float(out.loss.detach()):.3f} sampled acc {acc:.3f}")
            if acc >= TARGET_ACC:
                break
    model.eval()
    greedy = sampled_accuracy(model, tok, val_eval, 0.0)
    return {"sft_steps": step, "sampled_acc": acc, "greedy_acc": greedy, "history": history}


# ----------------------------------------------------------------------------- benchmark slice
def prepare_benchmarks(data_dir: Path, src_root: Path, max_rows: int, log=print) -> list[str]:
    """Write ``gsm8k_val.parquet`` / ``math500_val.parquet`` via ``python -m stapo_verl.data.prepare``.

    Returns the list of written parquet paths. A missing source folder or a missing/failed prepare
    command is reported and skipped (the synthetic validation set still works).
    """
    written = []
    for name in ("gsm8k", "math500"):
        src = src_root / name
        target = data_dir / f"{name}_val.parquet"
        if target.exists():
            written.append(str(target))
            continue
        if not src.is_dir():
            log(f"[make_assets] skip {name}: {src} not found")
            continue
        tmp = data_dir / f"_prep_{name}"
        cmd = [sys.executable, "-m", "stapo_verl.data.prepare", "--dataset", name, "--src", str(src),
               "--out", str(tmp), "--max-rows", str(max_rows)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            log(f"[make_assets] skip {name}: `{' '.join(cmd)}` failed: {r.stderr.strip()[-400:]}")
            continue
        files = sorted(tmp.rglob("*.parquet"))
        pick = [f for f in files if "test" in f.name or "val" in f.name] or files
        if not pick:
            log(f"[make_assets] skip {name}: prepare wrote no parquet under {tmp}")
            continue
        import pandas as pd

        df = pd.read_parquet(pick[0]).head(max_rows)
        df.to_parquet(target)
        shutil.rmtree(tmp, ignore_errors=True)
        written.append(str(target))
    return written


# ----------------------------------------------------------------------------- main
def build(out: Path, force: bool = False, n_train: int = 4000, n_val: int = 128, bench_rows: int = 16,
          src_root: Path | None = None, log=print) -> dict:
    """Build every asset under ``out`` unless the manifest already matches (then return it instantly).

    Returns:
        the manifest dict (also written to ``out/assets.json``).
    """
    src_root = default_data_src() if src_root is None else src_root
    manifest_path = out / "assets.json"
    if manifest_path.exists() and not force:
        m = json.loads(manifest_path.read_text())
        if m.get("version") == ASSET_VERSION:
            # benchmark rows may have become preparable since the first build
            if len(m.get("benchmark_val_files", [])) < 2 and m.get("n_train"):
                m["benchmark_val_files"] = prepare_benchmarks(out / "data", src_root, bench_rows, log)
                manifest_path.write_text(json.dumps(m, indent=1))
            return m
    t0 = time.time()
    import pandas as pd
    import torch

    # one thread: on shared cores, intra-op thread spinning slows torch down by an order of magnitude
    torch.set_num_threads(int(os.environ.get("STAPO_TORCH_THREADS", "1")))
    random.seed(SEED)
    if out.exists() and force:
        shutil.rmtree(out)
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    seen, probs = set(), []
    while len(probs) < n_train + n_val + 4000:
        p = make_problem(rng)
        if p["question"] not in seen:
            seen.add(p["question"])
            probs.append(p)
    val, rl_train, sft = probs[:n_val], probs[n_val:n_val + n_train], probs[n_val + n_train:]
    corpus = [p["question"] + "\n" + p["solution"] for p in sft] + ["user\nassistant\n"] * 50
    tok = build_tokenizer(corpus, out / "model")
    model = build_model(tok)
    stats = warm_start(model, tok, sft, val, log=log)
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out / "model"), safe_serialization=True)
    tok.save_pretrained(str(out / "model"))
    pd.DataFrame([verl_row(p, "train", i) for i, p in enumerate(rl_train)]).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame([verl_row(p, "val", i) for i, p in enumerate(val)]).to_parquet(out / "data" / "val.parquet")
    bench = prepare_benchmarks(out / "data", src_root, bench_rows, log)
    manifest = {
        "version": ASSET_VERSION, "seed": SEED, "model_dir": str(out / "model"),
        "train_file": str(out / "data" / "train.parquet"), "val_file": str(out / "data" / "val.parquet"),
        "benchmark_val_files": bench, "n_train": n_train, "n_val": n_val, "vocab_size": len(tok),
        "n_params": sum(p.numel() for p in model.parameters()), "sample_temperature": SAMPLE_TEMPERATURE,
        "build_seconds": round(time.time() - t0, 1), **stats,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv=None) -> int:
    """CLI entry: build or reuse the assets and print the manifest path and key numbers."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_dir())
    ap.add_argument("--force", action="store_true", help="rebuild even if the manifest exists")
    ap.add_argument("--src", type=Path, default=default_data_src(),
                    help="root holding gsm8k/ and math500/ (for the benchmark validation slice)")
    ap.add_argument("--bench-rows", type=int, default=16)
    a = ap.parse_args(argv)
    m = build(a.out.expanduser().resolve(), force=a.force, src_root=a.src, bench_rows=a.bench_rows)
    print(json.dumps({k: m.get(k) for k in ("model_dir", "train_file", "val_file", "benchmark_val_files",
                                        "sft_steps", "sampled_acc", "greedy_acc", "n_params")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
