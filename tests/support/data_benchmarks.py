"""The vendored benchmark data (``tests/data/benchmarks``): folder, data_source and gold answers of each dataset."""

from __future__ import annotations

import json
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parents[1] / "data" / "benchmarks"

#: dataset name (``stapo_verl.data``) → (folder under :data:`BENCHMARKS_DIR`, data_source prepare writes).
DATASETS: dict[str, tuple[str, str]] = {
    "aime24": ("aime24", "aime24"),
    "aime25": ("aime25", "aime25"),
    "amc23": ("amc23", "amc23"),
    "math500": ("math500", "math500"),
    "minerva": ("minerva_math", "minerva"),
    "olympiadbench": ("olympiadbench", "olympiadbench"),
    "gsm8k": ("gsm8k", "gsm8k"),
    "dapo-math-17k": ("dapo_math_17k", "math_dapo"),
}


def gold_rows(name: str) -> list[tuple[int, str, str]]:
    """``[(source row, problem id, gold answer), ...]`` of every row of dataset ``name`` (its ``gold.jsonl``).

    Raises:
        KeyError: unknown dataset name.
    """
    folder, _ = DATASETS[name]
    lines = (BENCHMARKS_DIR / folder / "gold.jsonl").read_text(encoding="utf-8").splitlines()
    return [tuple(json.loads(line)) for line in lines if line.strip()]


def manifest() -> dict:
    """``MANIFEST.json`` written by ``tests/data/benchmarks/build.py`` (file names and sha256 per dataset)."""
    return json.loads((BENCHMARKS_DIR / "MANIFEST.json").read_text(encoding="utf-8"))
