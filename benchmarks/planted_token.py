"""A tiny warm start with one planted spurious token J, and the measurements of J during RL.

The paper (arXiv 2602.15620, §3) says the late failure of GRPO-style training is driven by rare tokens sampled with low
probability at positions where the model is otherwise confident (low entropy), inside responses that are still
correct: their positive advantage pushes them up with a logit gradient of order 1/p, they spread, and the answers
break. The tiny assets (``stapo_verl.cpu.make_assets``) have rare tokens only because the warm start was trained with
label smoothing; nothing about them makes one rare token breed more of itself. This module builds a warm start in
which exactly that is planted, with one known token, so that a mask can be scored against the truth:

* **J** is :data:`J_TEXT` (``"~"``), one byte-level token that the synthetic data never uses otherwise;
* the warm start's solutions ``a+b=s1. s1-c=s2. \\boxed{s2}`` have :data:`SLOTS` = 4 *slots*, the positions whose
  next token is punctuation fixed by the format (before each ``=`` and before each step's closing ``.``): the
  lowest-entropy positions of the tiny warm start (:func:`solution_parts`);
* a solution's first J appears at each slot with probability :data:`P_FIRST` (rare); after a J, every later slot
  holds one with probability :data:`P_NEXT` (J makes further J's more likely);
* the warm start sees :data:`SFT_COPIES` copies of its problems, each with its own J draws (more distinct contexts
  of the rare J's, the same facts);
* one J is harmless: it stands between tokens of the working and the boxed answer is unchanged (reward +1);
* with :data:`BREAK_AT` = 2 J's or more the answer box holds a J too (``\\boxed{~5}``), which the project's scorer
  marks wrong: a few J's break the answer.

Everything else is the tiny assets' recipe (same problems, tokenizer, model shape, warm-start schedule and label
smoothing; :func:`stapo_verl.cpu.make_assets.build`), so the planted assets differ from the standard ones only in
the J's of the warm start's solutions. They live in their own directory (default ``~/.cache/stapo_verl/tiny_planted``)
and the tiny recipe reads them with ``STAPO_ASSETS=<dir>`` (its manifest has the same version, so the recipe does
not rebuild them).

Measurements (:func:`j_probability`, :func:`mask_vs_j`): p(J) at the slots of fixed prefixes (the validation rows'
clean solutions, teacher-forced), alone and after one J; the entropy at the slots against the response positions'
0.75 quantile (S2T's τ_h at the paper's q); the precision and recall of a run's silenced tokens against J, from the
plugin's silenced-token dump and verl's rollout dump.

Usage::

    python benchmarks/planted_token.py --build [--out DIR]      # build (cached) and print the warm start's J table
    python benchmarks/planted_token.py --measure RUN_DIR        # p(J) at every checkpoint of a run, mask vs J
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: the planted token's text (one byte-level token; the synthetic problems and solutions never contain it)
J_TEXT = "~"
#: per-slot probability of a solution's first J, and of every J after one
P_FIRST, P_NEXT = 0.006, 0.6
#: copies of the warm start's problems, each with its own J draws
SFT_COPIES = 4
#: the warm start's label smoothing (the standard assets': 0.03, whose stray tokens made off-format contexts in which
#: the first planted build put J into the box after any stray token; see docs/results.md)
LABEL_SMOOTHING = 0.01
#: J's at which the answer box holds a J (the answer is then wrong)
BREAK_AT = 2
#: slots per solution (before the first operand, after each ``=``, after the ``". "`` of the second step)
SLOTS = 4
#: the planted assets' seed of the J draws (the problems, model and warm start use make_assets.SEED)
PLANT_SEED = 4321
#: S2T's entropy quantile at the paper's setting (τ_h = the q-quantile of the candidates' entropies)
ENTROPY_Q = 0.75


def design() -> str:
    """The planted design's settings in one string (a cached build with other settings is rebuilt)."""
    return f"J={J_TEXT!r} p_first={P_FIRST} p_next={P_NEXT} break_at={BREAK_AT} copies={SFT_COPIES} " \
           f"slots=punctuation seed={PLANT_SEED} label_smoothing={LABEL_SMOOTHING}"


def default_dir() -> Path:
    """``$STAPO_PLANTED_ASSETS`` or ``~/.cache/stapo_verl/tiny_planted``."""
    return Path(os.environ.get("STAPO_PLANTED_ASSETS") or Path.home() / ".cache" / "stapo_verl" / "tiny_planted")


def solution_parts(problem: dict) -> tuple[list[str], str]:
    """The solution ``a op b = s1. s1 op c = s2. \\boxed{s2}`` of ``problem`` (:func:`make_assets.make_problem`) cut
    at its :data:`SLOTS` slots: ``(pieces, answer)`` with ``len(pieces) == SLOTS + 1``; slot k lies between
    ``pieces[k]`` and ``pieces[k + 1]``: before each ``=`` and before each step's closing ``.``, the positions whose
    next token is punctuation (the lowest-entropy positions of the tiny warm start, about 0.31 nats against a 0.75
    quantile of 0.36 over its response positions).

    Raises:
        ValueError: the solution does not have the two-step shape.
    """
    sol = problem["solution"]
    head, sep, box = sol.partition(" \\boxed{")
    steps = head.split(". ")
    if not sep or len(steps) != 2 or any(s.count("=") != 1 for s in steps) or not steps[1].endswith("."):
        raise ValueError(f"not a two-step solution: {sol!r}")
    (l1, r1), (l2, r2) = (s.split("=") for s in steps)
    # a op b | slot 0 | =s1 | slot 1 | . s1 op c | slot 2 | =s2 | slot 3 | . \boxed{answer}
    return [l1, "=" + r1, ". " + l2, "=" + r2[:-1], ""], box.rstrip("}")


def plant(problem: dict, rng: random.Random, p_first: float = P_FIRST, p_next: float = P_NEXT) -> tuple[str, int]:
    """``problem``'s solution with J's drawn at its slots (module docstring): ``(solution, number of J's)``.

    The first J at each slot with probability ``p_first``, every later slot with ``p_next``; with :data:`BREAK_AT`
    or more J's the box holds ``J + answer``. Draws exactly :data:`SLOTS` numbers from ``rng``.
    """
    pieces, answer = solution_parts(problem)
    out, count = [], 0
    for k in range(SLOTS):
        out.append(pieces[k])
        if rng.random() < (p_next if count else p_first):
            out.append(J_TEXT)
            count += 1
    out.append(pieces[SLOTS])
    box = (J_TEXT if count >= BREAK_AT else "") + answer
    return "".join(out) + f". \\boxed{{{box}}}", count


def with_j(problem: dict, slots: tuple[int, ...]) -> str:
    """``problem``'s solution with a J at each of ``slots`` (indices < :data:`SLOTS`) and the box as :func:`plant`
    writes it for that many J's."""
    pieces, answer = solution_parts(problem)
    out = []
    for k in range(SLOTS):
        out.append(pieces[k])
        if k in slots:
            out.append(J_TEXT)
    out.append(pieces[SLOTS])
    return "".join(out) + f". \\boxed{{{(J_TEXT if len(slots) >= BREAK_AT else '') + answer}}}"


def build(out: Path | None = None, force: bool = False, log=print) -> dict:
    """The planted assets in ``out`` (:func:`default_dir`): the tiny assets' recipe with J's planted in the warm
    start's solutions (module docstring); returns the manifest (``assets.json``), built once and cached.

    The manifest adds ``planted``: J, its token id, :data:`P_FIRST`, :data:`P_NEXT`, :data:`BREAK_AT`, the share of
    warm-start solutions with 1 and with >= 2 J's, and :func:`j_probability` of the built model on 128 validation
    rows. Raises ValueError when J is not one token of the tokenizer or occurs in the unplanted data.
    """
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
    rng = random.Random(ma.SEED)  # the same problems as the standard assets
    seen, probs = set(), []
    while len(probs) < n_train + n_val + 4000:
        p = ma.make_problem(rng)
        if p["question"] not in seen:
            seen.add(p["question"])
            probs.append(p)
    val, rl_train, sft = probs[:n_val], probs[n_val:n_val + n_train], probs[n_val + n_train:]
    if any(J_TEXT in p["question"] + p["solution"] for p in probs):
        raise ValueError(f"J={J_TEXT!r} occurs in the unplanted data: pick another J_TEXT")
    corpus = [p["question"] + "\n" + p["solution"] for p in sft] + ["user\nassistant\n"] * 50
    tok = ma.build_tokenizer(corpus, out / "model")  # the standard tokenizer: J is a byte token of its alphabet
    j_ids = tok.encode(J_TEXT, add_special_tokens=False)
    if len(j_ids) != 1:
        raise ValueError(f"J={J_TEXT!r} is {len(j_ids)} tokens, not one")
    prng = random.Random(PLANT_SEED)
    planted, counts = [], []
    for p in [p for _ in range(SFT_COPIES) for p in sft]:
        sol, k = plant(p, prng)
        planted.append({**p, "solution": sol})
        counts.append(k)
    model = ma.build_model(tok)
    stats = ma.warm_start(model, tok, planted, val, label_smoothing=LABEL_SMOOTHING, log=log)
    model.generation_config.bos_token_id = tok.convert_tokens_to_ids(ma.EOS_TOKEN)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids(ma.EOS_TOKEN)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out / "model"), safe_serialization=True)
    tok.save_pretrained(str(out / "model"))
    train_rows = [ma.verl_row(p, "train", i) for i, p in enumerate(rl_train)]
    pd.DataFrame(train_rows).to_parquet(out / "data" / "train.parquet")
    pd.DataFrame([ma.verl_row(p, "val", i) for i, p in enumerate(val)]).to_parquet(out / "data" / "val.parquet")
    measured = j_probability(model, tok, val[:128])
    manifest = {
        "version": ma.ASSET_VERSION, "seed": ma.SEED, "model_dir": str(out / "model"),
        "train_file": str(out / "data" / "train.parquet"), "val_file": str(out / "data" / "val.parquet"),
        "n_train": n_train, "n_val": n_val, "vocab_size": len(tok),
        "n_params": sum(p.numel() for p in model.parameters()), "sample_temperature": ma.SAMPLE_TEMPERATURE,
        "eos_token": ma.EOS_TOKEN, "end_of_turn_token": ma.END_OF_TURN, "model": dict(ma.MODEL),
        "head_dim": ma.DEFAULT_HEAD_DIM, "sft": {**ma.SFT, "label_smoothing": LABEL_SMOOTHING},
        "planted": {"design": design(), "j": J_TEXT, "j_id": j_ids[0], "p_first": P_FIRST, "p_next": P_NEXT,
                    "break_at": BREAK_AT,
                    "sft_copies": SFT_COPIES,
                    "seed": PLANT_SEED, "sft_share_one_j": counts.count(1) / len(counts),
                    "sft_share_two_or_more_j": sum(k >= 2 for k in counts) / len(counts), "warm_start": measured},
        "build_seconds": round(time.time() - t0, 1), **stats,
    }
    manifest_path.write_text(json.dumps(manifest, indent=1))
    log(f"[planted] {out}: J={J_TEXT!r} (id {j_ids[0]}), p(J) at clean slots {measured['p_j_clean']:.2e}, "
        f"after one J {measured['p_j_after_j']:.2e}; built in {manifest['build_seconds']:.0f} s")
    return manifest


def _prefix_stats(model, tok, problems: list[dict], solutions: list[str]):
    """Teacher-forced next-token distributions over each solution: ``(log_probs (B, T, V), entropy (B, T),
    char_offsets)`` with position t predicting response token t; ``char_offsets[b][t]`` the character offset in the
    solution where token t starts."""
    import torch
    from verl.utils.torch_functional import entropy_from_logits

    from stapo_verl.cpu.make_assets import encode_chat

    rows, offsets = [], []
    for p, sol in zip(problems, solutions):
        enc = tok(sol, add_special_tokens=False, return_offsets_mapping=True)
        rows.append((encode_chat(tok, p["question"]), enc["input_ids"]))
        offsets.append([a for a, _ in enc["offset_mapping"]])
    B, L = len(rows), max(len(a) + len(b) for a, b in rows)
    T = max(len(b) for _, b in rows)
    ids = torch.full((B, L), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros((B, L), dtype=torch.long)
    for i, (a, b) in enumerate(rows):
        ids[i, :len(a) + len(b)] = torch.tensor(a + b)
        att[i, :len(a) + len(b)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=att, position_ids=torch.arange(L).expand(B, L)).logits.float()
    idx = torch.tensor([[min(len(a) - 1 + t, L - 1) for t in range(T)] for a, _ in rows])
    logits = torch.gather(logits, 1, idx[..., None].expand(-1, -1, logits.shape[-1]))
    valid = torch.tensor([[t < len(b) for t in range(T)] for _, b in rows])
    return torch.log_softmax(logits, -1), entropy_from_logits(logits), offsets, valid


def _slot_chars(problem: dict, slots: tuple[int, ...]) -> list[int]:
    """Character offsets of the slots of :func:`with_j`'s solution (J's at ``slots``): where each slot's next
    character starts (a J where one is planted)."""
    pieces, _ = solution_parts(problem)
    pos, out = 0, []
    for k in range(SLOTS):
        pos += len(pieces[k])
        out.append(pos)
        if k in slots:
            pos += len(J_TEXT)
    return out


def j_probability(model, tok, problems: list[dict]) -> dict:
    """p(J) and the entropy at the slots of fixed prefixes (teacher-forced clean solutions of ``problems``), and
    p(J) at the slots after a J (the same solutions with one J at slot 0 or 1, the later slots measured).

    Returns:
        ``{"p_j_clean", "p_j_after_j"}`` (mean p over the slots measured), ``"p_j_other"`` (mean p(J) at the
        response positions that are not slots: J's rate where it was never planted), ``"entropy_slots"`` (mean
        nats at the clean slots), ``"entropy_q75"`` (the 0.75 quantile of the entropy over every clean response
        position: S2T's τ_h rule at q = 0.75 over that population), ``"share_slots_below_q75"`` (share of clean
        slots with entropy < that quantile), ``"p_j_clean_max"`` and ``"n"`` (prompts).
    """
    import torch

    j_id = tok.encode(J_TEXT, add_special_tokens=False)[0]
    clean = [with_j(p, ()) for p in problems]
    lp, ent, offs, valid = _prefix_stats(model, tok, problems, clean)
    slot_p, slot_h, other_p = [], [], []
    for b, p in enumerate(problems):
        starts = {c: t for t, c in enumerate(offs[b])}
        slot_t = {starts[c] for c in _slot_chars(p, ()) if c in starts}
        for t in range(len(offs[b])):
            (slot_p if t in slot_t else other_p).append(float(lp[b, t, j_id].exp()))
            if t in slot_t:
                slot_h.append(float(ent[b, t]))
    q75 = float(torch.quantile(ent[valid].double(), ENTROPY_Q))
    after = []
    for first in (0, 1):
        sols = [with_j(p, (first,)) for p in problems]
        lp1, _, offs1, _ = _prefix_stats(model, tok, problems, sols)
        for b, p in enumerate(problems):
            starts = {c: t for t, c in enumerate(offs1[b])}
            for k, c in enumerate(_slot_chars(p, (first,))):
                if k > first and c in starts:
                    after.append(float(lp1[b, starts[c], j_id].exp()))
    return {"p_j_clean": sum(slot_p) / len(slot_p), "p_j_clean_max": max(slot_p),
            "p_j_after_j": sum(after) / len(after), "p_j_other": sum(other_p) / len(other_p),
            "entropy_slots": sum(slot_h) / len(slot_h), "entropy_q75": q75,
            "share_slots_below_q75": sum(h < q75 for h in slot_h) / len(slot_h), "n": len(problems)}


def sampled_j(policy, rows: list[dict], *, n: int = 4, seed: int = 1, tau_p: float = 0.1,
              q: float = ENTROPY_Q) -> dict:
    """J in the policy's own samples: ``n`` seeded samples at T = 1 of each validation row (``rows``: verl rows;
    :func:`tiny_policy.sample_batch`), with the S2T rule applied as if every token had a positive advantage:
    candidates p < ``tau_p``, τ_h = the ``q`` quantile of the candidates' entropies.

    Returns:
        ``{"tokens", "j", "j_rate"`` (J's per response token), ``"j_below_tau_p"``, ``"j_below_tau_h"`` (shares of
        the sampled J's that are candidates, and that S2T's entropy rule would silence), ``"tau_h"``,
        ``"acc_no_j", "acc_one_j", "acc_two_or_more_j"`` (reward > 0 share, None without such responses),
        ``"responses_with_j"}``.
    """
    import torch

    import tiny_policy as tp

    j_id = policy.tokenizer.encode(J_TEXT, add_special_tokens=False)[0]
    batch = tp.add_statistics(policy, tp.sample_batch(policy, rows, n=n, rollout_seed=seed, global_step=0,
                                                      validate=True))
    m = batch.response_mask
    p, h = batch.log_prob.exp(), batch.entropy
    cand = m & (p < tau_p)
    tau_h = float(torch.quantile(h[cand].double(), q))
    is_j = m & (batch.responses == j_id)
    per = is_j.sum(-1)
    correct = batch.scores > 0

    def acc(sel):
        return float(correct[sel].float().mean()) if bool(sel.any()) else None

    nj = int(is_j.sum())
    return {"tokens": int(m.sum()), "j": nj, "j_rate": nj / max(int(m.sum()), 1),
            "j_below_tau_p": float((p[is_j] < tau_p).float().mean()) if nj else None,
            "j_below_tau_h": float((h[is_j] < tau_h).float().mean()) if nj else None, "tau_h": tau_h,
            "acc_no_j": acc(per == 0), "acc_one_j": acc(per == 1), "acc_two_or_more_j": acc(per >= 2),
            "responses_with_j": int((per > 0).sum())}


def mask_vs_j(run_dir: Path, j_id: int) -> dict:
    """Precision and recall of a run's silenced tokens against J, per step and overall.

    Reads the plugin's silenced-token dump (``<run_dir>/**/stapo_tokens.dp*.jsonl``, rows of kind ``silenced``;
    the run must set ``policy_loss.dump_tokens=True`` and ``dump_max_rows_per_step`` above the step's silenced count)
    and verl's rollout dump (``trainer.rollout_data_dir``: ``<run_dir>/rollout/<step>.jsonl`` with ``output`` and
    ``score``; the samples of one prompt share its ``input``).

    Returns:
        ``{"steps": {step: {"silenced", "silenced_j", "j_positive"}}, "precision", "recall"}``: precision = silenced
        J's / silenced tokens; recall = silenced J's / J's sampled in correct responses of groups with a wrong
        response (the J's with positive GRPO advantage). None where a denominator is 0.
    """
    steps: dict[int, dict] = {}
    for path in sorted(Path(run_dir).rglob("stapo_tokens.dp*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("kind") != "silenced":
                continue
            s = steps.setdefault(int(row["step"]), {"silenced": 0, "silenced_j": 0, "j_positive": 0})
            s["silenced"] += 1
            s["silenced_j"] += int(row["token_id"]) == j_id
    for path in sorted((Path(run_dir) / "rollout").glob("*.jsonl")):
        groups: dict[str, list] = {}
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                groups.setdefault(row["input"], []).append(row)
        step = int(path.stem)
        s = steps.setdefault(step, {"silenced": 0, "silenced_j": 0, "j_positive": 0})
        for rows in groups.values():
            if any(float(r["score"]) <= 0 for r in rows):
                s["j_positive"] += sum(r["output"].count(J_TEXT) for r in rows if float(r["score"]) > 0)
    sil = sum(s["silenced"] for s in steps.values())
    sil_j = sum(s["silenced_j"] for s in steps.values())
    pos = sum(s["j_positive"] for s in steps.values())
    return {"steps": dict(sorted(steps.items())), "precision": sil_j / sil if sil else None,
            "recall": sil_j / pos if pos else None}


def measure_run(run_dir: Path, assets: Path, prompts: int = 128) -> dict:
    """:func:`j_probability` at every checkpoint of ``run_dir`` (``ckpt/global_step_<n>/actor``; step 0 = the warm
    start) and :func:`mask_vs_j` of the run. One torch thread (the numbers do not depend on the machine's load)."""
    import torch
    from transformers.utils import logging as hf_logging

    import tiny_policy as tp

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()  # one "Loading weights" bar per checkpoint otherwise
    manifest = json.loads((Path(assets) / "assets.json").read_text())
    val = [{"question": r["prompt"][0]["content"], "solution": r["extra_info"]["solution"],
            "answer": r["reward_model"]["ground_truth"]} for r in tp.read_rows(manifest["val_file"])[:prompts]]
    curve = {}
    ckpts = sorted((int(p.name.split("_")[-1]), p / "actor") for p in (Path(run_dir) / "ckpt").glob("global_step_*"))
    for step, ckpt in [(0, None), *ckpts]:
        policy = tp.load_policy(assets, ckpt)
        curve[step] = j_probability(policy.model, policy.tokenizer, val)
    return {"p_j": curve, "mask": mask_vs_j(run_dir, int(manifest["planted"]["j_id"]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="build the planted assets (cached) and print the J table")
    ap.add_argument("--force", action="store_true", help="--build: rebuild")
    ap.add_argument("--out", type=Path, default=default_dir(), help="the planted assets' directory")
    ap.add_argument("--measure", type=Path, default=None, metavar="RUN_DIR",
                    help="p(J) at every checkpoint of a run, and its mask against J")
    a = ap.parse_args(argv)
    if a.build == (a.measure is not None):
        ap.error("say one of --build or --measure RUN_DIR")
    if a.build:
        m = build(a.out, force=a.force, log=lambda s: print(s, file=sys.stderr, flush=True))
        print(json.dumps(m["planted"], indent=1))
        return 0
    result = measure_run(a.measure, a.out)
    (a.measure / "planted_measure.json").write_text(json.dumps(result, indent=1))
    for step, r in result["p_j"].items():
        print(f"step {step}: p(J) clean slots {r['p_j_clean']:.2e}, after a J {r['p_j_after_j']:.2e}, "
              f"elsewhere {r['p_j_other']:.2e}")
    mk = result["mask"]
    print(f"mask vs J: precision {mk['precision']}, recall {mk['recall']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
