"""The vendored benchmark data is what ``tests/data/benchmarks/build.py`` wrote and ``README.md`` records."""

from __future__ import annotations

import hashlib

import pytest

from support.data_benchmarks import BENCHMARKS_DIR, DATASETS, gold_rows, manifest

#: rows of each published file (the gold file has one line per row)
ORIGINAL_ROWS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 675,
                 "gsm8k": 1319, "dapo-math-17k": 17917}


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_files_match_the_manifest_and_readme(name):
    entry = manifest()[name]
    readme = (BENCHMARKS_DIR / "README.md").read_text()
    for key in ("slice", "gold"):
        path = BENCHMARKS_DIR / entry[key]
        assert _sha256(path) == entry[f"{key}_sha256"], path
        assert entry[f"{key}_sha256"] in readme
    assert entry["original_sha256"] in readme


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_gold_file_has_every_row(name):
    rows = gold_rows(name)
    assert [r[0] for r in rows] == list(range(ORIGINAL_ROWS[name]))
    assert all(isinstance(pid, str) and isinstance(gold, str) and gold.strip() == gold and gold for _, pid, gold in rows)


def test_small():
    total = sum(p.stat().st_size for p in BENCHMARKS_DIR.rglob("*") if p.is_file() and p.name != "gold.jsonl")
    assert total < 400_000, total  # the slices, README, MANIFEST and build.py
