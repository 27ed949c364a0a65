"""verl RL parquet schema (read by verl's ``verl.utils.dataset.rl_dataset.RLHFDataset``).

One row::

    {"data_source": "math500",
     "prompt": [{"role": "user", "content": problem + JUSTRL_SUFFIX}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "<answer str>"},
     "extra_info": {"split": "test", "index": 0, "benchmark": "math500", "problem_id": "...",
                    "source_row": 0, "problem": "<bare problem>"}}

The prompt suffix is JustRL's boxed-answer instruction (JustRL, https://github.com/thunlp/JustRL); verl applies the
chat template itself.
"""

from __future__ import annotations

from pathlib import Path

#: JustRL's instruction appended to every problem.
JUSTRL_SUFFIX = "\n\nPlease reason step by step, and put your final answer within \\boxed{}."


def arrow_schema():
    """The ``pyarrow`` schema of a prepared row (pyarrow is imported here, on first use; built per call, which costs
    microseconds, rather than cached for the process).

    Returns:
        ``pyarrow.Schema`` with the columns of the module docstring (``extra_info.index`` and ``source_row`` are
        ``int64``, everything else strings).
    """
    import pyarrow as pa

    return pa.schema(
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


def __getattr__(name: str):
    """``SCHEMA`` is :func:`arrow_schema` (built on first access, so importing this module needs no pyarrow)."""
    if name == "SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    """Write rows with :func:`arrow_schema` (creating parent directories); returns the path.

    Raises:
        pyarrow.ArrowInvalid, pyarrow.ArrowTypeError: a row does not fit the schema.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), out_path)
    return out_path
