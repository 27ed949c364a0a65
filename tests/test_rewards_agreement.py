"""Scorer agreement on every prepared benchmark row (full sets, MATH500 included).

For each row: a response ending in ``\\boxed{gold}`` must score correct, and one ending in a perturbed answer must
score wrong, with the scorer the row's ``data_source`` routes to. Perturbation: the first digit d → (d+1) mod 10;
answers without digits get another row's (different) gold answer. Rates are printed (``pytest -s``) and put in
the assertion messages.

Thresholds (measured, see docs/data_rewards_eval.md): gold agreement must be 100 % on every benchmark. Perturbed
answers must be rejected on ≥ 99 % of rows: math-verify is deliberately lenient in a few places and accepts
5 known perturbations — equations compared by their right-hand side (MATH500 ``6x - 7y + 11z + 4 = 0`` vs
``5x...``; OlympiadBench ``\\angle BEA_{2}=90`` vs ``A_{1}``) and two Minerva symbolic answers — and a perturbed
answer whose verification times out (some Minerva/OlympiadBench symbolic answers; 1 s budget here) counts as wrong, as in
training.
"""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest

from stapo_verl.data.prepare import prepare_dataset
from stapo_verl.eval.scoring import score_many
from stapo_verl.rewards import scorer_for

from test_data_prepare import SHARED, needs_shared

BENCHMARKS = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench", "gsm8k", "dapo-math-17k"]
PERTURBED_MIN = 0.99
DAPO_ROWS = 2000  # DAPO answers are all integers; a 2,000-row prefix exercises the strict scorer enough
TIMEOUT_S = 5.0  # gold answers: the training default
PERTURBED_TIMEOUT_S = 1.0  # perturbed answers: a timeout counts as wrong anyway; keeps the suite short


def perturb(gold: str, others: list[str]) -> str:
    m = re.search(r"\d", gold)
    if m:
        i = m.start()
        return gold[: i] + str((int(gold[i]) + 1) % 10) + gold[i + 1 :]
    return next(o for o in others if o.strip() != gold.strip())


def response(answer: str) -> str:
    return "Let me work through this carefully.\nSo the final answer is $\\boxed{" + answer + "}$."


@needs_shared
@pytest.mark.parametrize("name", BENCHMARKS)
def test_gold_and_perturbed_agreement(name, tmp_path, capsys):
    summary = prepare_dataset(name, str(SHARED), tmp_path, max_rows=DAPO_ROWS if name == "dapo-math-17k" else None)
    rows = pq.read_table(summary.out_path).to_pylist()
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    source = rows[0]["data_source"]
    gold_items = [(source, response(gold), gold) for gold in golds]
    perturbed = [perturb(g, golds[i + 1 :] + golds[:i]) for i, g in enumerate(golds)]
    pert_items = [(source, response(p), g) for p, g in zip(perturbed, golds)]
    gold_res = score_many(gold_items, timeout_s=TIMEOUT_S)
    pert_res = score_many(pert_items, timeout_s=PERTURBED_TIMEOUT_S)
    gold_ok = [r["acc"] for r in gold_res]
    pert_ok = [not r["acc"] for r in pert_res]
    gold_rate, pert_rate = sum(gold_ok) / len(rows), sum(pert_ok) / len(rows)
    timeouts = (sum(r["timeout"] for r in gold_res), sum(r["timeout"] for r in pert_res))
    accepted = [f"{perturbed[i]!r} (gold {golds[i]!r})" for i, ok in enumerate(pert_ok) if not ok]
    msg = (f"{name} [{scorer_for(source)}] rows={len(rows)} gold-correct={gold_rate:.2%} "
           f"perturbed-wrong={pert_rate:.2%} timeouts(gold, perturbed)={timeouts}")
    with capsys.disabled():
        print("\n" + msg + "".join(f"\n   accepted perturbation: {a}" for a in accepted))
    gold_failures = [golds[i] for i, ok in enumerate(gold_ok) if not ok]
    assert gold_rate == 1.0 and timeouts[0] == 0, msg + f" gold failures: {gold_failures}"
    assert pert_rate >= PERTURBED_MIN, msg + f" accepted perturbations: {accepted}"
