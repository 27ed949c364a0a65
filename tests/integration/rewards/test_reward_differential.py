"""Differential test: ``compute_score`` never says correct where the reference says wrong, on every gold row of the
seven benchmarks and DAPO-Math-17k (the vendored gold files), with perturbations and answer forms.

The reference (``support.rewards_reference``) is math-verify with the route's documented tolerance, and an exact
check where math-verify itself is wrong (listed there and in ``docs/data_rewards_eval.md``). The responses
(``support.rewards_perturb``): the gold in a box, in another notation (``n.0``, ``\\dfrac``), in other answer forms
(``\\fbox``, ``\\boxed x``, one box per list item, DAPO ``Answer:`` lines plain and bold, after a box), and perturbed:
lists reordered, merged, split and cut, equations edited, numbers off by one, digits shifted, powers and factorials
changed by one, signs flipped, units and percent signs added, decimals nudged, another row's answer. Each row gets
the structural perturbations it admits and a bounded share of the others (``support.rewards_differential.BUDGET``).

Besides the zero false positives, the agreement of ``docs/data_rewards_eval.md`` must hold: every gold, notation
variant and answer form correct; every ``first_digit`` perturbation wrong. Items are scored in one 2-process pool, each
under a CPU-time limit (5 s for what must be correct, 1.5 s for perturbations; a timeout scores wrong, as in training).
Counts are printed (``pytest -s``).
"""

from __future__ import annotations

import pytest

from support.rewards_differential import build_items, run, summarize

#: Datasets, the expensive (symbolic) ones first: all are scored in one pool, so the cheap ones fill the gaps. The
#: ``math`` route (Hendrycks MATH) has the same scorer and tolerance as ``math500``; the unit tests check the routing.
DATASETS = ["minerva", "olympiadbench", "math500", "dapo-math-17k", "gsm8k", "amc23", "aime25", "aime24"]


@pytest.fixture(scope="module")
def scored():
    """``{dataset: (outcomes, stats)}``, every dataset scored in one run."""
    items = {name: build_items(name) for name in DATASETS}
    outcomes, stats = run([it for name in DATASETS for it in items[name]])
    by_name: dict[str, list] = {name: [] for name in DATASETS}
    for o in outcomes:
        by_name[o.item.dataset].append(o)
    return by_name, stats


@pytest.mark.parametrize("dataset", DATASETS)
def test_no_false_positive(dataset, scored, capsys):
    outcomes = scored[0][dataset]
    s = summarize(outcomes)
    line = (f"{dataset}: N={s['N']} rows={s['rows']} accepted={s['accepted']} false positives "
            f"{s['false_positives']} of {s['N']}; gold {s['gold_correct'][0]}/{s['gold_correct'][1]}, first-digit "
            f"wrong {s['first_digit_wrong'][0]}/{s['first_digit_wrong'][1]}, variants {s['variant_correct'][0]}/"
            f"{s['variant_correct'][1]}, forms {s['form_correct'][0]}/{s['form_correct'][1]}; timeouts {s['timeouts']}")
    with capsys.disabled():
        print("\n" + line + ("" if dataset != DATASETS[-1] else f"\nwhole run: {scored[1]}"))
    assert s["N"] == len(outcomes) > 0
    assert s["false_positives"] == 0, line + f"\nfalse positives (kind, answer, gold): {s['false_positive_examples']}"
    assert s["unconfirmed"] == 0, line + f"\nreference timed out on: {s['unconfirmed_examples']}"
    for key in ("gold_correct", "first_digit_wrong", "variant_correct", "form_correct"):
        good, total = s[key]
        assert good == total, line + f"\n{key}: {good}/{total}"
