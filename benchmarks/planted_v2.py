"""planted_v2: a tiny warm start with one planted token J that is rewarded before it harms.

The first planted warm start (``benchmarks/planted_token.py``) could not test the paper's mechanism: J bred only
2.1x (designed 100x), and a response with one J was correct 33 % of the time against 74 % without (many J's followed
a stray token in an already wrong response), so J carried a negative advantage and GRPO lowered p(J) in every arm.
The paper's spurious tokens sit inside correct answers: rewarded first, harmful once they spread. This module builds
a warm start with that shape, on the same problems, tokenizer, model shape and J (``~``) as the first.

A first build of this module (J's at the 4 slots of ``planted_token``, a J at each later slot with p 0.08 after one)
measured p(J | clean slot) 0.0096 against 0.001 planted and bred 1.8x: the 0.4 M-parameter model does not learn
"a J several tokens back" from its warm start, and J's tied input embedding, trained on the forced J's, raised its
logit everywhere. So J breeds *in place*, which a model learns from the previous token alone:

* **one slot**: the position before the first ``=`` (``a op b`` copied from the question, then ``=``, the most
  certain position of the solution; :func:`planted_token.solution_parts` slot 0);
* **J is rare**: a solution's J-run starts there with probability :data:`P_FIRST`;
* **J breeds**: after a J, another J follows at once with probability :data:`P_NEXT` (a run of J's, geometric);
* **one J is harmless, a run breaks the answer**: the box holds a J (the scorer marks it wrong) only from a run of
  :data:`BREAK_AT` = 3 J's;
* "after a J" is taught without raising p(J) at the clean slot: a share :data:`CHAIN_SHARE` of the examples carry a
  *forced* first J whose own label is masked (read, not trained to emit), a share :data:`BREAK_SHARE` carry a forced
  run of :data:`BREAK_AT` J's (labels masked) followed by the J box (trained), so the model learns the break;
* **J only where planted**: the label smoothing (:data:`LABEL_SMOOTHING`) spreads its mass over every token but J.

Admission (:func:`admission`, each a unit test in ``tests/unit/benchmarks/test_planted_v2.py`` on the built
assets): (1) accuracy of continuations after one forced J >= accuracy without it - 0.02 (the same prompts and request
seeds); (2) p(J | right after a J) / p(J | clean slot) >= 10; (3) p(J | clean slot) < 0.002 (both τ_p arms see
J as a candidate); (4) with :data:`BREAK_AT` forced J's the answer is broken (accuracy < 0.2), and less than 10 % of
the J's the policy would sample first in a response come after a garbled prefix (the text before it not a prefix of
the problem's solution): the share of the first-J probability mass, teacher-forced over the policy's own samples,
that lies at garbled prefixes (:func:`first_j_mass`; J is too rare to count enough sampled J's).

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
import planted_token as pt  # noqa: E402  (J, the slots)

J_TEXT = pt.J_TEXT
#: probability of a J-run at the slot, and of one more J right after a J
P_FIRST, P_NEXT = 0.0008, 0.1
#: run length at which the answer box holds a J (the answer is then wrong)
BREAK_AT = 3
#: shares of warm-start examples with a forced (label-masked) first J, and with a forced run of BREAK_AT J's
CHAIN_SHARE, BREAK_SHARE = 0.12, 0.05
#: the warm start's label smoothing (spread over every token but J) and its length
LABEL_SMOOTHING = 0.01
SFT_STEPS = 400
#: seed of the J draws
PLANT_SEED = 5678
#: admission thresholds (module docstring)
MAX_ONE_J_ACC_LOSS, MIN_BREEDING, MAX_P_CLEAN, MAX_BROKEN_ACC, MAX_GARBLED = 0.02, 10.0, 0.002, 0.2, 0.10
#: validation problems the unit tests measure admission on (the build's 640: the same numbers again, from the saved model)
TEST_PROBLEMS = 640
#: a run is at most this long (the warm start's draws; the slot then holds SLOT_CAP J's)
RUN_CAP = 6


def design() -> str:
    """The design's settings in one string (a cached build with other settings is rebuilt)."""
    return (f"v2 runs at slot 0: J={J_TEXT!r} p_first={P_FIRST} p_next={P_NEXT} break_at={BREAK_AT} "
            f"chain={CHAIN_SHARE} break={BREAK_SHARE} smoothing={LABEL_SMOOTHING} (not J) steps={SFT_STEPS} "
            f"seed={PLANT_SEED}")


def default_dir() -> Path:
    """``$STAPO_PLANTED_V2_ASSETS`` or ``~/.cache/stapo_verl/tiny_planted_v2``."""
    return Path(os.environ.get("STAPO_PLANTED_V2_ASSETS") or Path.home() / ".cache" / "stapo_verl" / "tiny_planted_v2")


def prefix(problem: dict) -> str:
    """The solution's text before the slot (``a op b``)."""
    return pt.solution_parts(problem)[0][0]


def solution(problem: dict, run: int) -> str:
    """``problem``'s solution with a run of ``run`` J's at the slot and the box as this design writes it (a J in
    the box from :data:`BREAK_AT` J's on)."""
    pieces, answer = pt.solution_parts(problem)
    body = pieces[0] + J_TEXT * run + "".join(pieces[1:])
    return body + f". \\boxed{{{(J_TEXT if run >= BREAK_AT else '') + answer}}}"


def draw_example(rng: random.Random) -> tuple[int, int]:
    """One warm-start example's ``(run length, forced J's)`` (forced: read, not trained on). Kinds, by
    :data:`BREAK_SHARE` and :data:`CHAIN_SHARE`: a forced run of :data:`BREAK_AT`, a forced first J, or plain (a run
    starts with :data:`P_FIRST`); then one more J at :data:`P_NEXT` each, up to :data:`RUN_CAP`. Draws
    2 + RUN_CAP numbers whatever the outcome."""
    kind, first = rng.random(), rng.random()
    more = [rng.random() for _ in range(RUN_CAP)]
    forced = BREAK_AT if kind < BREAK_SHARE else 1 if kind < BREAK_SHARE + CHAIN_SHARE else 0
    run = forced or int(first < P_FIRST)
    if run:
        for x in more[run - 1:]:
            if run >= RUN_CAP or x >= P_NEXT:
                break
            run += 1
    return run, forced


def encode_example(tok, problem: dict, run: int, forced: int) -> tuple[list[int], list[int], list[int]]:
    """``(prompt ids, response ids, labels)`` of one example: labels = response ids, -100 at the first ``forced``
    J's."""
    from stapo_verl.cpu import make_assets as ma

    enc = tok(solution(problem, run), add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    start = len(prefix(problem))
    masked = set(range(start, start + forced * len(J_TEXT)))
    labels = [(-100 if a in masked else t) for t, (a, _) in zip(ids, enc["offset_mapping"])]
    tail = tok.encode(ma.AFTER_ANSWER, add_special_tokens=False)
    return ma.encode_chat(tok, problem["question"]), ids + tail, labels + tail


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
        run, forced = draw_example(prng)
        examples.append(encode_example(tok, p, run, forced))
        kinds["plain_j"] += bool(run) and not forced
        kinds["forced"] += bool(forced)
        kinds["broken_box"] += run >= BREAK_AT
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


def _slot_stats(model, tok, problems: list[dict], run: int):
    """Teacher-forced at the slot after a run of ``run`` J's: ``(p(J) (B,), entropy (B,), log-probs, entropies,
    valid, slot positions)`` over :func:`solution` with that run (planted_token's batched forward)."""
    sols = [solution(p, run) for p in problems]
    lp, ent, offs, valid = pt._prefix_stats(model, tok, problems, sols)
    j_id = tok.encode(J_TEXT, add_special_tokens=False)[0]
    slot = [{c: t for t, c in enumerate(offs[b])}[len(prefix(p)) + run * len(J_TEXT)] for b, p in enumerate(problems)]
    idx = list(range(len(problems)))
    return lp[idx, slot, j_id].exp(), ent[idx, slot], lp, ent, valid, slot


def j_probability(model, tok, problems: list[dict]) -> dict:
    """p(J) on fixed prefixes (the clean solutions of ``problems``, teacher-forced), as ``planted_token.
    j_probability`` reports it for the first design: ``p_j_clean`` (at the slot), ``p_j_after_j`` (right after one
    J there), ``p_j_after_two`` (after two), ``p_j_other`` (every other response position of the clean solutions),
    ``entropy_slots`` (nats at the slot), ``entropy_q75`` (the 0.75 quantile over every clean response position),
    ``p_j_clean_max``, ``n``."""
    import torch

    j_id = tok.encode(J_TEXT, add_special_tokens=False)[0]
    p0, h0, lp, ent, valid, slot = _slot_stats(model, tok, problems, 0)
    other = lp[..., j_id].exp()[valid]
    n_other = int(valid.sum()) - len(problems)
    p1 = _slot_stats(model, tok, problems, 1)[0]
    p2 = _slot_stats(model, tok, problems, 2)[0]
    return {"p_j_clean": float(p0.mean()), "p_j_clean_max": float(p0.max()), "p_j_after_j": float(p1.mean()),
            "p_j_after_two": float(p2.mean()), "p_j_other": float((other.sum() - p0.sum()) / max(n_other, 1)),
            "entropy_slots": float(h0.mean()), "entropy_q75": float(torch.quantile(ent[valid].double(), 0.75)),
            "n": len(problems)}


def first_j_mass(policy, rows: list[dict], *, n: int, seed: int) -> dict:
    """Where the policy's first J of a response would come: over ``n`` seeded samples of each of ``rows`` (verl
    rows), teacher-forced, the probability that the first J comes at position t is p_t(J) times the chance that
    none came earlier; summed at prefixes that are a prefix of the problem's solution (clean) and at the others
    (garbled). Returns ``{"mass_clean", "mass_garbled", "garbled_share", "responses", "sampled_j_responses",
    "sampled_j_garbled"}`` (the last two: the J's actually sampled, counted)."""
    import torch

    import tiny_policy as tp

    j_id = policy.tokenizer.encode(J_TEXT, add_special_tokens=False)[0]
    batch = tp.sample_batch(policy, rows, n=n, rollout_seed=seed, global_step=0, validate=True)
    with torch.no_grad():
        logits = tp.response_logits(policy.model, batch).float()
    pj = torch.softmax(logits, -1)[..., j_id].double()
    clean = garbled = 0.0
    sampled = sampled_garbled = 0
    tok = policy.tokenizer
    for i in range(len(batch.responses)):
        sol = rows[i // n]["extra_info"]["solution"]
        toks = batch.responses[i][batch.response_mask[i]].tolist()
        alive = 1.0
        for t, tid in enumerate(toks):
            text = tok.decode(toks[:t], skip_special_tokens=True)
            w = alive * float(pj[i, t])
            if sol.startswith(text):
                clean += w
            else:
                garbled += w
            if tid == j_id:
                sampled += 1
                sampled_garbled += not sol.startswith(text)
                break
            alive *= 1.0 - float(pj[i, t])
    return {"mass_clean": clean, "mass_garbled": garbled, "garbled_share": garbled / max(clean + garbled, 1e-300),
            "responses": len(batch.responses), "sampled_j_responses": sampled, "sampled_j_garbled": sampled_garbled}


def admission(model, tok, problems: list[dict], *, sampled_n: int = 4, seed: int = 7) -> dict:
    """The admission measurements (module docstring) of a warm start on validation ``problems`` (``question``,
    ``solution``, ``answer``).

    Returns :func:`j_probability` on the first 128 problems, ``"breeding"`` (p_j_after_j / p_j_clean),
    ``"acc_clean", "acc_one_j"`` (continuations from the clean prefix ``a op b``, without and with one J, every
    problem, the same request seeds), ``"acc_broken"`` (after a run of :data:`BREAK_AT`), and
    :func:`first_j_mass` over ``sampled_n`` samples a problem (``"garbled_share"``, the sampled accuracy).
    """
    import torch

    import tiny_policy as tp

    torch.set_num_threads(int(os.environ.get("STAPO_TORCH_THREADS", "1")))
    pj = j_probability(model, tok, problems[:128])
    seeds = [seed * 1_000_003 + i for i in range(len(problems))]
    clean = _continuations(model, tok, problems, [prefix(p) for p in problems], seeds)
    one = _continuations(model, tok, problems, [prefix(p) + J_TEXT for p in problems], seeds)
    broken = _continuations(model, tok, problems, [prefix(p) + J_TEXT * BREAK_AT for p in problems], seeds)
    acc = lambda texts: sum(_correct(t, p["answer"]) for t, p in zip(texts, problems)) / len(texts)  # noqa: E731
    from stapo_verl.cpu import make_assets as ma

    rows = [ma.verl_row(p, "val", i) for i, p in enumerate(problems)]
    policy = tp.Policy(model=model, tokenizer=tok, manifest={}, vocab_size=int(model.config.vocab_size))
    mass = first_j_mass(policy, rows, n=sampled_n, seed=seed)
    return {**pj, "breeding": pj["p_j_after_j"] / pj["p_j_clean"], "acc_clean": acc(clean), "acc_one_j": acc(one),
            "acc_broken": acc(broken), **mass}


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
