"""Scorer agreement on every prepared benchmark row (full sets, MATH500 included).

For each row: a response ending in ``\\boxed{gold}`` must score correct, and one ending in a perturbed answer must
score wrong, with the scorer the row's ``data_source`` routes to. Perturbation: the first digit d → (d+1) mod 10;
answers without digits get another row's (different) gold answer. The gold answer in another notation must also
score correct (issue 9 item 5): an integer ``n`` written ``n.0``, every ``\\frac`` written ``\\dfrac``; rows without
either have no variant. DAPO rows (``math_dapo``) must also accept the gold on DAPO's published ``Answer:`` line
(item 6). MATH500 is scored a second time through the ``math`` route (Hendrycks MATH's name). Rates are printed
(``pytest -s``) and put in the assertion messages.

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
#: (prepared dataset, data_source to score it with; None = the row's own)
CASES = [(name, None) for name in BENCHMARKS] + [("math500", "math")]
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


def variant(gold: str) -> str | None:
    """The gold answer in an equivalent notation (``5`` → ``5.0``, ``\\frac`` → ``\\dfrac``), or None."""
    if re.fullmatch(r"-?\d+", gold):
        return gold + ".0"
    if "\\frac" in gold:
        return gold.replace("\\frac", "\\dfrac")
    return None


@needs_shared
@pytest.mark.parametrize(("name", "route"), CASES, ids=[n if r is None else f"{n}-as-{r}" for n, r in CASES])
def test_gold_and_perturbed_agreement(name, route, tmp_path, capsys):
    summary = prepare_dataset(name, str(SHARED), tmp_path, max_rows=DAPO_ROWS if name == "dapo-math-17k" else None)
    rows = pq.read_table(summary.out_path).to_pylist()
    golds = [r["reward_model"]["ground_truth"] for r in rows]
    source = route or rows[0]["data_source"]
    gold_items = [(source, response(gold), gold) for gold in golds]
    perturbed = [perturb(g, golds[i + 1 :] + golds[:i]) for i, g in enumerate(golds)]
    pert_items = [(source, response(p), g) for p, g in zip(perturbed, golds)]
    variants = [(variant(g), g) for g in golds if variant(g) is not None]
    var_items = [(source, response(v), g) for v, g in variants]
    line_items = [(source, "Let me work through this carefully.\nAnswer: " + g, g) for g in golds]
    gold_res = score_many(gold_items, timeout_s=TIMEOUT_S)
    pert_res = score_many(pert_items, timeout_s=PERTURBED_TIMEOUT_S)
    var_res = score_many(var_items, timeout_s=TIMEOUT_S)
    line_ok = [r["acc"] for r in score_many(line_items, timeout_s=TIMEOUT_S)] if source == "math_dapo" else []
    gold_ok = [r["acc"] for r in gold_res]
    pert_ok = [not r["acc"] for r in pert_res]
    var_ok = [r["acc"] for r in var_res]
    gold_rate, pert_rate = sum(gold_ok) / len(rows), sum(pert_ok) / len(rows)
    var_rate = sum(var_ok) / len(var_ok) if var_ok else 1.0
    line_rate = sum(line_ok) / len(line_ok) if line_ok else 1.0
    timeouts = (sum(r["timeout"] for r in gold_res), sum(r["timeout"] for r in pert_res),
                sum(r["timeout"] for r in var_res))
    accepted = [f"{perturbed[i]!r} (gold {golds[i]!r})" for i, ok in enumerate(pert_ok) if not ok]
    msg = (f"{name} [{source} -> {scorer_for(source)}] rows={len(rows)} gold-correct={gold_rate:.2%} "
           f"perturbed-wrong={pert_rate:.2%} variant-correct={var_rate:.2%} (n={len(var_ok)}) "
           + (f"answer-line-correct={line_rate:.2%} " if line_ok else "")
           + f"timeouts(gold, perturbed, variant)={timeouts}")
    with capsys.disabled():
        print("\n" + msg + "".join(f"\n   accepted perturbation: {a}" for a in accepted))
    gold_failures = [golds[i] for i, ok in enumerate(gold_ok) if not ok]
    var_failures = [var_items[i][1][-60:] for i, ok in enumerate(var_ok) if not ok][:10]
    assert gold_rate == 1.0 and timeouts[0] == 0, msg + f" gold failures: {gold_failures}"
    assert pert_rate >= PERTURBED_MIN, msg + f" accepted perturbations: {accepted}"
    assert var_rate == 1.0 and timeouts[2] == 0, msg + f" variant failures (first 10): {var_failures}"
    assert line_rate == 1.0, msg
