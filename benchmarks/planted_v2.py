"""planted_v2: a tiny warm start with one planted token J that is rewarded before it harms.

The first planted warm start (``benchmarks/planted_token.py``) could not test the paper's mechanism: J bred only
2.1x (designed 100x), and a response with one J was correct 33 % of the time against 74 % without (many J's followed
a stray token in an already wrong response), so J carried a negative advantage and GRPO lowered p(J) in every arm.
The paper's spurious tokens sit inside correct answers: rewarded first, harmful once they spread. This module builds
a warm start with that shape, on the same problems, tokenizer, model shape and J (``~``) as the first:

* **J is rare**: a solution's first J comes at each of the 4 slots (the positions before ``=`` and before a step's
  closing ``.``, :func:`planted_token.solution_parts`) with probability :data:`P_FIRST`;
* **J breeds**: after a J, each later slot holds one with probability :data:`P_NEXT`;
* **one J is harmless, chains break the answer**: the box holds a J (the scorer marks it wrong) only with
  :data:`BREAK_AT` = 3 J's or more;
* the conditional "after a J" is taught without raising p(J) in clean contexts: a share :data:`CHAIN_SHARE` of the
  warm start's examples carry a *forced* first J at a random slot whose own label is masked (the model reads it but
  is not trained to emit it), and a share :data:`BREAK_SHARE` carry :data:`BREAK_AT` forced J's (labels masked)
  followed by the J box (trained), so the model learns the break;
* **J only where planted**: the warm start's label smoothing (:data:`LABEL_SMOOTHING`) spreads its mass over every
  token but J, so J has no floor outside the slots, and stray contexts do not call for it.

Admission (:func:`admission`, each a unit test in ``tests/unit/benchmarks/test_planted_v2.py`` on the built
assets): (1) accuracy of continuations after one forced J >= accuracy without it - 0.02 (the same prefixes and
request seeds); (2) p(J | after a J) / p(J | clean slot) >= 10; (3) p(J | clean slot) < 0.002 (both τ_p arms see
J as a candidate); (4) with :data:`BREAK_AT` forced J's the answer is broken (accuracy < 0.2), and fewer than 10 %
of the sampled responses with a J are garbled before their first J (the text before it is not a prefix of the
problem's solution).

Usage::

    python benchmarks/planted_v2.py --build [--out DIR] [--force]   # build (cached), print the admission numbers
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import planted_token as pt  # noqa: E402  (J, the slots, p(J) on fixed prefixes)

J_TEXT, SLOTS = pt.J_TEXT, pt.SLOTS
#: per-slot probability of a solution's first J (trained), and of a J at every slot after one
P_FIRST, P_NEXT = 0.001, 0.08
#: J's at which the answer box holds a J (the answer is then wrong)
BREAK_AT = 3
#: shares of warm-start examples with a forced (label-masked) first J, and with BREAK_AT forced J's
CHAIN_SHARE, BREAK_SHARE = 0.25, 0.08
#: the warm start's label smoothing (spread over every token but J) and its length
LABEL_SMOOTHING = 0.01
SFT_STEPS = 400
#: seed of the J draws
PLANT_SEED = 5678
#: admission thresholds (module docstring)
MAX_ONE_J_ACC_LOSS, MIN_BREEDING, MAX_P_CLEAN, MAX_BROKEN_ACC, MAX_GARBLED = 0.02, 10.0, 0.002, 0.2, 0.10


def design() -> str:
    """The design's settings in one string (a cached build with other settings is rebuilt)."""
    return (f"v2 J={J_TEXT!r} p_first={P_FIRST} p_next={P_NEXT} break_at={BREAK_AT} chain={CHAIN_SHARE} "
            f"break={BREAK_SHARE} smoothing={LABEL_SMOOTHING} (not J) steps={SFT_STEPS} seed={PLANT_SEED}")


def default_dir() -> Path:
    """``$STAPO_PLANTED_V2_ASSETS`` or ``~/.cache/stapo_verl/tiny_planted_v2``."""
    return Path(os.environ.get("STAPO_PLANTED_V2_ASSETS") or Path.home() / ".cache" / "stapo_verl" / "tiny_planted_v2")


def solution(problem: dict, slots) -> str:
    """``problem``'s solution with a J at each of ``slots`` and the box as this design writes it (a J in the box
    from :data:`BREAK_AT` J's on)."""
    pieces, answer = pt.solution_parts(problem)
    out = []
    for k in range(SLOTS):
        out.append(pieces[k])
        if k in slots:
            out.append(J_TEXT)
    out.append(pieces[SLOTS])
    return "".join(out) + f". \\boxed{{{(J_TEXT if len(slots) >= BREAK_AT else '') + answer}}}"


def draw_example(problem: dict, rng: random.Random) -> tuple[list[int], list[int]]:
    """One warm-start example: ``(J slots, forced J slots)`` (forced: read, not trained on). Kinds, by
    :data:`CHAIN_SHARE` and :data:`BREAK_SHARE`: plain (first J at :data:`P_FIRST`), chain (a forced first J at a
    random slot), break (:data:`BREAK_AT` forced J's from slot 0 or 1); after a J, :data:`P_NEXT` at every later
    slot. Draws the same count of numbers whatever the outcome (6)."""
    kind, start = rng.random(), rng.randrange(SLOTS)
    draws = [rng.random() for _ in range(SLOTS)]
    if kind < BREAK_SHARE:
        first = start % (SLOTS - BREAK_AT + 1)
        forced = list(range(first, first + BREAK_AT))
    elif kind < BREAK_SHARE + CHAIN_SHARE:
        forced = [start]
    else:
        forced = []
    slots = list(forced)
    for k in range(SLOTS):
        if k in forced:
            continue
        if draws[k] < (P_NEXT if any(s < k for s in slots) else P_FIRST):
            slots.append(k)
    return sorted(slots), forced


def encode_example(tok, problem: dict, slots, forced) -> tuple[list[int], list[int], list[int]]:
    """``(prompt ids, response ids, labels)`` of one example: labels = response ids, -100 at the forced J's."""
    from stapo_verl.cpu import make_assets as ma

    text = solution(problem, slots)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    chars = set(_j_chars(problem, slots, forced))
    labels = [(-100 if a in chars else t) for t, (a, _) in zip(ids, enc["offset_mapping"])]
    tail = tok.encode(ma.AFTER_ANSWER, add_special_tokens=False)
    return ma.encode_chat(tok, problem["question"]), ids + tail, labels + tail


def _j_chars(problem: dict, slots, forced) -> list[int]:
    """Character offsets of the forced J's in :func:`solution` with J's at ``slots``."""
    pieces, _ = pt.solution_parts(problem)
    pos, out = 0, []
    for k in range(SLOTS):
        pos += len(pieces[k])
        if k in slots:
            if k in forced:
                out.append(pos)
            pos += len(J_TEXT)
    return out


def warm_start(model, tok, examples: list[tuple], j_id: int, *, steps: int = SFT_STEPS, log=print) -> dict:
    """The tiny warm start (``make_assets.warm_start``'s schedule: AdamW 0.9/0.98, lr 4e-3, 30 warm-up steps,
    cosine to 0, batch 48, clip 1.0) on ``examples`` (``(prompt, response, labels)``), loss on the labelled
    response tokens; label smoothing :data:`LABEL_SMOOTHING` over every token but ``j_id``."""
    import math

    import torch

    from stapo_verl.cpu import make_assets as ma

    torch.manual_seed(PLANT_SEED)
    rng = random.Random(PLANT_SEED)
    batch, lr, warmup = ma.SFT["batch"], ma.SFT["lr"], ma.SFT["warmup"]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps)))
    V = model.config.vocab_size
    smooth = torch.full((V,), 1.0 / (V - 1))
    smooth[j_id] = 0.0
    model.train()
    t0, loss = time.time(), torch.zeros(())
    for step in range(steps):
        idx = rng.sample(range(len(examples)), batch)
        L = max(len(examples[i][0]) + len(examples[i][1]) for i in idx)
        ids = torch.full((batch, L), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((batch, L), -100, dtype=torch.long)
        att = torch.zeros((batch, L), dtype=torch.long)
        for r, i in enumerate(idx):
            pr, resp, lab = examples[i]
            n = len(pr) + len(resp)
            ids[r, :n] = torch.tensor(pr + resp)
            labels[r, len(pr):n] = torch.tensor(lab)
            att[r, :n] = 1
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        target = labels[:, 1:]
        keep = target != -100
        logp = torch.log_softmax(logits[keep].float(), -1)
        nll = -logp.gather(-1, target[keep][:, None]).squeeze(-1)
        loss = ((1 - LABEL_SMOOTHING) * nll - LABEL_SMOOTHING * (logp * smooth).sum(-1)).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:
            log(f"[planted_v2] warm start {step + 1}/{steps}: loss {float(loss):.4f} ({time.time() - t0:.0f} s)")
    model.eval()
    return {"sft_steps": steps, "sft_loss": float(loss.detach()), "sft_seconds": round(time.time() - t0, 1)}


def build(out: Path | None = None, force: bool = False, log=print) -> dict:
    """The planted_v2 assets in ``out`` (:func:`default_dir`), built once and cached; returns the manifest
    (``assets.json``, with ``planted``: J, its id, the design and :func:`admission` of the built model)."""
    import pandas as pd
    import torch
    from transformers.utils import logging as hf_logging

    from stapo_verl.cpu import make_assets as ma

    out = Path(out or default_dir()).expanduser().resolve()
    manifest_path = out / "assets.json"
    if manifest_path.exists() and not force:
        m = json.loads(manifest_path.read_text())
        if m.get("version") == ma.ASSET_VERSION and m.get("planted", {}).get("design") == design():
            return m
    t0 = time.time()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(int(os.environ.get("STAPO_TORCH_THREADS", "1")))
    (out / "model").mkdir(parents=True, exist_ok=True)
    (out / "data").mkdir(parents=True, exist_ok=True)
    n_train, n_val = 4000, ma.N_VAL
    rng = random.Random(ma.SEED)  # the same problems as the standard and first planted assets
    seen, probs = set(), []
    while len(probs) < n_train + n_val + 4000:
        p = ma.make_problem(rng)
        if p["question"] not in seen:
            seen.add(p["question"])
            probs.append(p)
    val, rl_train, sft = probs[:n_val], probs[n_val:n_val + n_train], probs[n_val + n_train:]
    corpus = [p["question"] + "\n" + p["solution"] for p in sft] + ["user\nassistant\n"] * 50
    tok = ma.build_tokenizer(corpus, out / "model")
    j_ids = tok.encode(J_TEXT, add_special_tokens=False)
    if len(j_ids) != 1:
        raise ValueError(f"J={J_TEXT!r} is {len(j_ids)} tokens, not one")
    prng = random.Random(PLANT_SEED)
    examples, kinds = [], {"plain_j": 0, "forced": 0, "broken_box": 0}
    for p in [p for _ in range(pt.SFT_COPIES) for p in sft]:
        slots, forced = draw_example(p, prng)
        examples.append(encode_example(tok, p, slots, forced))
        kinds["plain_j"] += bool(slots) and not forced
        kinds["forced"] += bool(forced)
        kinds["broken_box"] += len(slots) >= BREAK_AT
    model = ma.build_model(tok)
    stats = warm_start(model, tok, examples, j_ids[0], log=log)
    for key in ("bos_token_id", "eos_token_id"):
        setattr(model.generation_config, key, tok.convert_tokens_to_ids(ma.EOS_TOKEN))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out / "model"), safe_serialization=True)
    tok.save_pretrained(str(out / "model"))
    pd.DataFrame([ma.verl_row(p, "train", i) for i, p in enumerate(rl_train)]).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame([ma.verl_row(p, "val", i) for i, p in enumerate(val)]).to_parquet(out / "data" / "val.parquet")
    manifest = {
        "version": ma.ASSET_VERSION, "seed": ma.SEED, "model_dir": str(out / "model"),
        "train_file": str(out / "data" / "train.parquet"), "val_file": str(out / "data" / "val.parquet"),
        "n_train": n_train, "n_val": n_val, "vocab_size": len(tok),
        "n_params": sum(p.numel() for p in model.parameters()), "sample_temperature": ma.SAMPLE_TEMPERATURE,
        "eos_token": ma.EOS_TOKEN, "end_of_turn_token": ma.END_OF_TURN, "model": dict(ma.MODEL),
        "head_dim": ma.DEFAULT_HEAD_DIM, "sft": {**ma.SFT, "label_smoothing": LABEL_SMOOTHING, "steps": SFT_STEPS},
        "planted": {"design": design(), "j": J_TEXT, "j_id": j_ids[0], "p_first": P_FIRST, "p_next": P_NEXT,
                    "break_at": BREAK_AT, "examples": len(examples), "kinds": kinds},
        **stats,
    }
    manifest["planted"]["admission"] = admission(model, tok, val)
    manifest["build_seconds"] = round(time.time() - t0, 1)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    log(f"[planted_v2] {out}: {json.dumps(manifest['planted']['admission'])}; built in {manifest['build_seconds']} s")
    return manifest


def _continuations(model, tok, problems, prefixes: list[str], seeds: list[int], max_tokens: int = 40) -> list[str]:
    """The full response text (forced prefix + sampled continuation at T = 1) for each problem's prefix."""
    from stapo_verl.cpu import make_assets as ma
    from stapo_verl.cpu.rollout_server import HFGenerator, SamplingSettings

    gen = HFGenerator(model, ma.stop_ids(tok), tok.pad_token_id, seed=0, pad_to=128)
    s = SamplingSettings(temperature=1.0, top_p=1.0, top_k=0, logprobs=False)
    prompts, heads = [], []
    for p, pre in zip(problems, prefixes):
        head = tok.encode(pre, add_special_tokens=False) if pre else []
        prompts.append(ma.encode_chat(tok, p["question"]) + head)
        heads.append(head)
    texts = []
    for i in range(0, len(prompts), 64):
        outs = gen.generate(prompts[i:i + 64], [max_tokens - len(h) for h in heads[i:i + 64]], s, seeds[i:i + 64])
        texts += [tok.decode(h + o[0], skip_special_tokens=True) for h, o in zip(heads[i:i + 64], outs)]
    return texts


def _correct(text: str, answer: str) -> bool:
    from stapo_verl.rewards.dapo import extract_boxed_answer

    return (extract_boxed_answer(text, tail_chars=None) or "").strip() == answer


def admission(model, tok, problems: list[dict], *, sampled_n: int = 8, seed: int = 7) -> dict:
    """The admission measurements (module docstring) of a warm start on validation ``problems`` (``question``,
    ``solution``, ``answer``).

    Returns ``{"acc_clean", "acc_one_j"`` (continuations from each slot's clean prefix, without and with one J
    there, 4 slots x every problem, the same request seeds), ``"acc_broken"`` (from :data:`BREAK_AT` J's at slots
    0..BREAK_AT-1), ``"p_j_clean", "p_j_after_j", "breeding"`` (teacher-forced, 128 problems), ``"sampled_responses",
    "j_responses", "garbled_before_j", "garbled_share"`` (``sampled_n`` samples a problem), ``"sampled_acc"}``.
    """
    import torch

    torch.set_num_threads(int(os.environ.get("STAPO_TORCH_THREADS", "1")))
    pj = pt.j_probability(model, tok, problems[:128])
    clean_pre, j_pre, rows, seeds = [], [], [], []
    for i, p in enumerate(problems):
        pieces, _ = pt.solution_parts(p)
        for k in range(SLOTS):
            head = "".join(pieces[:k + 1])
            clean_pre.append(head)
            j_pre.append(head + J_TEXT)
            rows.append(p)
            seeds.append(seed * 1_000_003 + i * SLOTS + k)
    clean = _continuations(model, tok, rows, clean_pre, seeds)
    one = _continuations(model, tok, rows, j_pre, seeds)
    broken_pre = [solution(p, tuple(range(BREAK_AT))).split(". \\boxed")[0] for p in problems]
    broken_pre = [s[:s.rfind(J_TEXT) + 1] for s in broken_pre]
    broken = _continuations(model, tok, problems, broken_pre, [seed * 7 + i for i in range(len(problems))])
    acc = lambda texts, ps: sum(_correct(t, p["answer"]) for t, p in zip(texts, ps)) / len(texts)  # noqa: E731
    sampled_rows = [p for p in problems for _ in range(sampled_n)]
    sampled = _continuations(model, tok, sampled_rows, [""] * len(sampled_rows),
                             [seed * 31 + i for i in range(len(sampled_rows))])
    with_j = [(t, p) for t, p in zip(sampled, sampled_rows) if J_TEXT in t]
    garbled = sum(not p["solution"].startswith(t[:t.index(J_TEXT)]) for t, p in with_j)
    return {"acc_clean": acc(clean, rows), "acc_one_j": acc(one, rows), "acc_broken": acc(broken, problems),
            "p_j_clean": pj["p_j_clean"], "p_j_after_j": pj["p_j_after_j"], "p_j_other": pj["p_j_other"],
            "breeding": pj["p_j_after_j"] / pj["p_j_clean"], "entropy_slots": pj["entropy_slots"],
            "entropy_q75": pj["entropy_q75"], "sampled_responses": len(sampled), "j_responses": len(with_j),
            "garbled_before_j": garbled, "garbled_share": garbled / len(with_j) if with_j else None,
            "sampled_acc": acc(sampled, sampled_rows),
            "sampled_acc_with_j": acc([t for t, _ in with_j], [p for _, p in with_j]) if with_j else None}


def val_problems(manifest: dict) -> list[dict]:
    """The validation rows of built assets as problems (``question``, ``solution``, ``answer``)."""
    import tiny_policy as tp

    return [{"question": r["prompt"][0]["content"], "solution": r["extra_info"]["solution"],
             "answer": r["reward_model"]["ground_truth"]} for r in tp.read_rows(manifest["val_file"])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="build (cached) and print the admission numbers")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--out", type=Path, default=default_dir())
    a = ap.parse_args(argv)
    if not a.build:
        ap.error("say --build")
    m = build(a.out, force=a.force, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(m["planted"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
