"""Build (once, cached) the tiny assets of the CPU run: tokenizer, Qwen3 model, synthetic data. No download.

Usage::

    python -m stapo_verl.cpu.make_assets [--out DIR] [--head-dim N] [--force] [--print-recipe-vars]

``DIR`` defaults to ``$STAPO_ASSETS`` or ``~/.cache/stapo_verl/tiny``; ``--head-dim 32`` builds the set that verl's vLLM
rollout can serve (:data:`VLLM_HEAD_DIM`; the tiny recipe keeps it in ``~/.cache/stapo_verl/tiny_vllm``). Layout::

    DIR/model/            HF Qwen3ForCausalLM + tokenizer (ByteLevel BPE, Qwen ChatML template); like a Qwen3
                          *base* checkpoint, EOS is <|endoftext|> while chat turns end with <|im_end|>
    DIR/data/train.parquet (4,000 rows), DIR/data/val.parquet (:data:`N_VAL` rows)   synthetic two-step
                          arithmetic word problems (verl schema); the warm start uses 4,000 further rows
    DIR/assets.json       manifest: sizes, warm-start settings and sampled/greedy accuracy, build time, seed;
                          its presence = done

Everything is seeded (one torch thread, so a machine rebuilds the same bytes); a second call returns
immediately when the manifest matches :data:`ASSET_VERSION`. The model is warm-started with a fixed, short
plain-torch supervised pass (:data:`SFT`, under a minute on one core) with label smoothing 0.03: the policy
knows the answers (greedy validation accuracy ~1.0) but keeps ~3 % of its probability spread over the whole
vocabulary at every position, so a sampled answer of ~20 tokens often contains a stray token (sampled accuracy
~0.55 at T = 1). That is the regime in which RL gains quickly (it removes the tail while keeping the facts, at the
tiny recipe's lr; docs/cpu_backend.md has the measured curves), and the stray tokens inside answers that are still
right are the low-probability, low-entropy positive-advantage tokens STAPO silences (arXiv 2602.15620 §3).

Validation holds the synthetic rows only: real benchmark rows (GSM8K, MATH500) score 0 for a 0.4 M-parameter model
trained on single-digit arithmetic, so they measure nothing at this scale; the tiny run needs no external data.

End of turn vs end of sequence: the tokenizer, ``config.json`` and ``generation_config.json``
name ``<|endoftext|>`` as EOS, as Qwen3-Base does, while the chat template and the warm start end the
assistant turn with ``<|im_end|>`` (and the warm start teaches the base-model habit of opening a new turn
after it: ``<|im_end|>\n<|im_start|>user\n``). A rollout that stops only at the EOS therefore runs past the
answer; the recipes stop at both (``stapo_verl.stop_tokens``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path
from types import MappingProxyType

ASSET_VERSION = 4
SEED = 1234
SAMPLE_TEMPERATURE = 1.0
#: Model shape (Qwen3, tied embeddings): ~0.37 M parameters.
MODEL = MappingProxyType({"hidden": 96, "layers": 3})
#: Attention head size of the default asset set (4 query heads, 2 KV heads).
DEFAULT_HEAD_DIM = MODEL["hidden"] // 4
#: The head size of the asset set for verl's vLLM rollout on CPU (``--head-dim``; ``ROLLOUT=vllm`` in the tiny
#: recipe): vLLM's CPU attention has kernels for a fixed list of head sizes, which holds 32 but not the default 24
#: ("Unsupported CPU attention configuration"). The default set keeps 24, so its documented numbers stay.
VLLM_HEAD_DIM = 32
#: Warm start: fixed length (no early stop: the build time and the result do not depend on evaluations).
SFT = MappingProxyType({"steps": 300, "batch": 48, "lr": 4e-3, "warmup": 30, "label_smoothing": 0.03})
EOS_TOKEN = "<|endoftext|>"  # end of sequence (Qwen3-Base: tokenizer eos, config / generation_config eos)
END_OF_TURN = "<|im_end|>"  # what the chat template closes a turn with
#: What the warm start teaches after the answer: end the turn, then open a new one (a base model's habit).
AFTER_ANSWER = END_OF_TURN + "\n<|im_start|>user\n"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Validation rows: at n = 1 sample each the standard error of an accuracy is <= sqrt(0.25 / 640) = 2.0 points.
N_VAL = 640
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NAMES = ("Ann", "Bob", "Cara", "Dan", "Eve", "Finn", "Gia", "Hal", "Ivy", "Jon", "Kim", "Leo")
ITEMS = ("apples", "books", "coins", "cards", "pens", "shells", "stamps", "marbles")


def default_dir() -> Path:
    """``$STAPO_ASSETS`` or ``~/.cache/stapo_verl/tiny``."""
    return Path(os.environ.get("STAPO_ASSETS") or Path.home() / ".cache" / "stapo_verl" / "tiny")


# ----------------------------------------------------------------------------- synthetic problems
def make_problem(rng: random.Random) -> dict:
    """One two-step arithmetic word problem with single-digit operands.

    Two shapes, ``a+b-c`` and ``a-b+c`` (every intermediate and the answer are non-negative). Single digits
    keep the facts few enough that a 300-step warm start learns them.

    Returns:
        dict with ``question`` (str), ``solution`` (worked steps ending in ``\\boxed{answer}``) and ``answer``
        (str of a non-negative int).
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.randrange(2) == 0:  # a + b - c
        kind, a, b = "add_sub", rng.randint(2, 9), rng.randint(2, 9)
        c = rng.randint(1, min(9, a + b - 1))
        s1, s2 = a + b, a + b - c
        q = f"{name} has {a} {item}, gets {b} more and gives {c} away. How many are left?"
    else:  # a - b + c
        kind, a = "sub_add", rng.randint(3, 9)
        b, c = rng.randint(1, a - 1), rng.randint(2, 9)
        s1, s2 = a - b, a - b + c
        q = f"{name} has {a} {item}, gives {b} away and gets {c} more. How many are there now?"
    op1, op2 = ("+", "-") if kind == "add_sub" else ("-", "+")
    return {"question": q, "solution": f"{a}{op1}{b}={s1}. {s1}{op2}{c}={s2}. \\boxed{{{s2}}}", "answer": str(s2)}


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

    Byte-level means any UTF-8 text encodes (real benchmark rows included). Special tokens as in Qwen3-Base:
    EOS and pad ``<|endoftext|>``, no BOS, ChatML template whose turns end with ``<|im_end|>``.
    Returns the loaded tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token="<|endoftext|>",
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
def build_model(tok, hidden: int = MODEL["hidden"], layers: int = MODEL["layers"], head_dim: int | None = None):
    """A small random ``Qwen3ForCausalLM`` (tied embeddings, fp32) for ``tok``'s vocabulary.

    ``bos_token_id`` / ``eos_token_id`` are ``<|endoftext|>``, as in Qwen3-Base's ``config.json``. ``head_dim``
    defaults to ``hidden // 4`` (4 query heads); Qwen3 lets it differ from that, as :data:`VLLM_HEAD_DIM` needs.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim or hidden // 4,
        max_position_embeddings=1024,
        tie_word_embeddings=True, bos_token_id=tok.convert_tokens_to_ids(EOS_TOKEN),
        eos_token_id=tok.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tok.pad_token_id, rope_theta=10000.0, torch_dtype="float32",
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(cfg)


def stop_ids(tok) -> list[int]:
    """The ids a rollout of these assets stops at: end of sequence and end of turn (what the recipes set)."""
    return sorted({tok.convert_tokens_to_ids(EOS_TOKEN), tok.convert_tokens_to_ids(END_OF_TURN)})


def sampled_accuracy(model, tok, problems: list[dict], temperature: float, max_tokens: int = 40,
                     seed: int = 0) -> float:
    """Fraction of ``problems`` whose sampled answer's last ``\\boxed{}`` equals the ground truth.

    Generation stops at :func:`stop_ids` (``temperature == 0``: greedy), like the tiny recipe's rollout.
    """
    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings
    from stapo_verl.rewards.dapo import extract_boxed_answer

    gen = HFGenerator(model, stop_ids(tok), tok.pad_token_id, seed=seed)
    s = SamplingSettings(temperature=temperature, top_p=1.0, top_k=0, logprobs=False)
    prompts = [encode_chat(tok, p["question"]) for p in problems]
    correct = 0
    for i in range(0, len(prompts), 64):
        outs = gen.generate(prompts[i:i + 64], [max_tokens] * len(prompts[i:i + 64]), s)
        for (ids, _), p in zip(outs, problems[i:i + 64]):
            text = tok.decode(ids, skip_special_tokens=True)
            correct += int((extract_boxed_answer(text, tail_chars=None) or "").strip() == p["answer"])
    return correct / max(1, len(problems))


def warm_start(model, tok, train: list[dict], val: list[dict], steps: int = SFT["steps"],
               batch: int = SFT["batch"], lr: float = SFT["lr"], warmup: int = SFT["warmup"],
               label_smoothing: float = SFT["label_smoothing"], log=print) -> dict:
    """Supervised pass on ``prompt + solution + AFTER_ANSWER`` (loss on the response only), fixed length.

    AdamW (betas 0.9/0.98, no weight decay), linear warm-up then cosine decay to 0, grad clip 1.0,
    ``torch.nn.functional.cross_entropy(label_smoothing=...)``: the target puts ``label_smoothing`` of its
    mass uniformly on the vocabulary, which leaves the policy a thin tail on every token (the stray tokens
    of a sampled answer; see the module docstring). Evaluated once at the end on ``val[:128]`` (true answers).

    Returns:
        dict ``{"sft_steps", "sft_loss", "sampled_acc", "greedy_acc", "sft_seconds"}``; accuracies in [0, 1],
        sampled at :data:`SAMPLE_TEMPERATURE`, greedy at T = 0.
    """
    import math

    import torch
    import torch.nn.functional as F

    t0 = time.time()
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    tail = tok.encode(AFTER_ANSWER, add_special_tokens=False)
    enc = []
    for p in train:
        pr = encode_chat(tok, p["question"])
        enc.append((pr, tok.encode(p["solution"], add_special_tokens=False) + tail))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))

    def schedule(s: int) -> float:
        return min(1.0, (s + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    loss = torch.zeros(())
    for _ in range(steps):
        idx = rng.sample(range(len(enc)), batch)
        L = max(len(enc[i][0]) + len(enc[i][1]) for i in idx)
        ids = torch.full((batch, L), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, L), -100, dtype=torch.long)
        att = torch.zeros((batch, L), dtype=torch.long)
        for r, i in enumerate(idx):
            pr, resp = enc[i]
            n = len(pr) + len(resp)
            ids[r, :n] = torch.tensor(pr + resp)
            labels[r, len(pr):n] = torch.tensor(resp)
            att[r, :n] = 1
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100,
                               label_smoothing=label_smoothing)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    loss = float(loss.detach())
    sft_seconds = time.time() - t0
    val_eval = val[:128]
    sampled = sampled_accuracy(model, tok, val_eval, SAMPLE_TEMPERATURE)
    greedy = sampled_accuracy(model, tok, val_eval, 0.0)
    log(f"[make_assets] warm start: {steps} steps in {sft_seconds:.0f} s, loss {loss:.3f}, "
        f"sampled acc {sampled:.3f}, greedy acc {greedy:.3f}")
    return {"sft_steps": steps, "sft_loss": round(loss, 4), "sampled_acc": sampled, "greedy_acc": greedy,
            "sft_seconds": round(sft_seconds, 1)}


# ----------------------------------------------------------------------------- main
@contextlib.contextmanager
def build_lock(out: Path):
    """Hold an exclusive ``flock`` on ``<out's parent>/.<out's name>.lock`` while the assets at ``out`` are read or
    built: two jobs started at once on one machine (two recipes, two test workers) on an empty cache would otherwise
    both build into one directory, and the later one would read a half-written model. The lock goes with its file
    descriptor, so a killed builder never leaves it held.

    Raises:
        OSError: the parent directory cannot be created or the lock file cannot be opened.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(out: Path, force: bool = False, n_train: int = 4000, n_val: int = N_VAL, log=print,
          head_dim: int = DEFAULT_HEAD_DIM) -> dict:
    """Build every asset under ``out`` unless the manifest already matches (then return it instantly).

    One builder at a time per directory (:func:`build_lock`): a second caller waits, then returns the first one's
    manifest.

    Args:
        out: asset directory (created; with ``force`` it is deleted first).
        force: rebuild even when ``out/assets.json`` has version :data:`ASSET_VERSION`.
        n_train: RL training rows; n_val: validation rows (the warm start uses 4,000 further rows).
        log: progress sink (one line per phase).
        head_dim: attention head size (:data:`DEFAULT_HEAD_DIM`, the default asset set; :data:`VLLM_HEAD_DIM` for
            verl's vLLM rollout).

    Returns:
        the manifest dict (also written to ``out/assets.json``): ``model_dir``, ``train_file``, ``val_file``
        (absolute paths), sizes, the warm-start settings and its sampled/greedy accuracy, ``build_seconds``.
    Raises:
        ValueError: ``out`` holds assets of another ``head_dim`` (use another ``--out``, or ``--force``).
    """
    with build_lock(out):
        return _build(Path(out), force, n_train, n_val, log, head_dim)


def _build(out: Path, force: bool, n_train: int, n_val: int, log, head_dim: int) -> dict:
    """:func:`build` under its lock."""
    manifest_path = out / "assets.json"
    if manifest_path.exists() and not force:
        m = json.loads(manifest_path.read_text())
        if m.get("version") == ASSET_VERSION:
            have = m.get("head_dim", DEFAULT_HEAD_DIM)
            if have != head_dim:
                raise ValueError(f"{out} holds tiny assets with head_dim={have}, asked for head_dim={head_dim}: "
                                 f"use another --out (STAPO_ASSETS) or --force")
            return m
    t0 = time.time()
    import pandas as pd
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's one-shard progress bar
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
    model = build_model(tok, head_dim=head_dim)
    stats = warm_start(model, tok, sft, val, log=log)
    # Qwen3-Base's generation_config.json: bos = eos = <|endoftext|> (an int, not a list), no <|im_end|>.
    model.generation_config.bos_token_id = tok.convert_tokens_to_ids(EOS_TOKEN)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(EOS_TOKEN)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out / "model"), safe_serialization=True)
    tok.save_pretrained(str(out / "model"))
    pd.DataFrame([verl_row(p, "train", i) for i, p in enumerate(rl_train)]).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame([verl_row(p, "val", i) for i, p in enumerate(val)]).to_parquet(out / "data" / "val.parquet")
    manifest = {
        "version": ASSET_VERSION, "seed": SEED, "model_dir": str(out / "model"),
        "train_file": str(out / "data" / "train.parquet"), "val_file": str(out / "data" / "val.parquet"),
        "n_train": n_train, "n_val": n_val, "vocab_size": len(tok),
        "n_params": sum(p.numel() for p in model.parameters()), "sample_temperature": SAMPLE_TEMPERATURE,
        "eos_token": EOS_TOKEN, "end_of_turn_token": END_OF_TURN, "model": dict(MODEL), "head_dim": head_dim,
        "sft": dict(SFT),
        "build_seconds": round(time.time() - t0, 1), **stats,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def recipe_vars(manifest: dict) -> list[str]:
    """The three lines ``recipes/common/cpu.sh`` reads: ``MODEL_PATH``, ``TRAIN_FILES``, ``VAL_FILES``.

    Paths are quoted for Hydra (``'...'``; ``VAL_FILES`` is a one-element list) so a path with ``=`` or ``,`` stays
    one value. Raises KeyError when the manifest lacks ``model_dir``, ``train_file`` or ``val_file``.
    """
    return [manifest["model_dir"], repr(manifest["train_file"]), "[" + repr(manifest["val_file"]) + "]"]


def main(argv=None) -> int:
    """CLI entry: build or reuse the assets; one progress line on stderr.

    With ``--print-recipe-vars`` stdout holds exactly the lines of :func:`recipe_vars` (what the tiny recipe reads),
    otherwise the manifest path.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=default_dir())
    ap.add_argument("--force", action="store_true", help="rebuild even if the manifest exists")
    ap.add_argument("--print-recipe-vars", action="store_true",
                    help="print model dir, train file and validation files (one a line) for recipes/common/cpu.sh")
    ap.add_argument("--head-dim", type=int, default=DEFAULT_HEAD_DIM,
                    help=f"attention head size (default {DEFAULT_HEAD_DIM}; {VLLM_HEAD_DIM} for verl's vLLM rollout "
                         f"on CPU)")
    a = ap.parse_args(argv)
    if a.head_dim <= 0:
        ap.error(f"--head-dim {a.head_dim}: must be a positive integer")
    out = a.out.expanduser().resolve()
    manifest = out / "assets.json"
    cached = not a.force and manifest.exists() and json.loads(manifest.read_text()).get("version") == ASSET_VERSION

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if not cached:
        log(f"[make_assets] building the tiny assets in {out} (about a minute on one core; cached afterwards)")
    m = build(out, force=a.force, log=log, head_dim=a.head_dim)
    log(f"[make_assets] {out}: {m['n_params']:,}-parameter Qwen3, {m['n_train']} train / {m['n_val']} validation "
        f"rows, warm start sampled acc {m['sampled_acc']:.2f} (greedy {m['greedy_acc']:.2f})"
        + ("" if cached else f", built in {m['build_seconds']:.0f} s"))
    print("\n".join(recipe_vars(m)) if a.print_recipe_vars else out / "assets.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
