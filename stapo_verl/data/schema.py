"""verl RL parquet schema (``verl_notes.md`` §11; ``verl/utils/dataset/rl_dataset.py`` reads it).

One row::

    {"data_source": "math500",
     "prompt": [{"role": "user", "content": problem + JUSTRL_SUFFIX}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "<answer str>"},
     "extra_info": {"split": "test", "index": 0, "benchmark": "math500", "problem_id": "...",
                    "source_row": 0, "problem": "<bare problem>"}}

The prompt suffix is JustRL's boxed-answer instruction (spec §6.1, A14); verl applies the chat template itself.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

#: JustRL's instruction appended to every problem (spec §6.1 "Prompt (details)").
JUSTRL_SUFFIX = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."

SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("benchmark", pa.string()),
                    ("problem_id", pa.string()),
                    ("source_row", pa.int64()),
                    ("problem", pa.string()),
                ]
            ),
        ),
    ]
)


def make_row(
    *, data_source: str, benchmark: str, split: str, index: int, problem: str, answer: str, problem_id: str,
    source_row: int,
) -> dict:
    """Build one verl row (see the module docstring); ``index`` is the row's position in the output file."""
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": problem + JUSTRL_SUFFIX}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "split": split,
            "index": index,
            "benchmark": benchmark,
            "problem_id": problem_id,
            "source_row": source_row,
            "problem": problem,
        },
    }


def write_parquet(rows: list[dict], out_path: str | Path) -> Path:
    """Write rows with :data:`SCHEMA` (creating parent directories); returns the path."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), out_path)
    return out_path
