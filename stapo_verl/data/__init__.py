"""Dataset preparation: published benchmark/training files → verl RL parquet (``python -m stapo_verl.data.prepare``).

Importing this package needs neither pyarrow nor datasets: they are imported where files are read or written.
"""

from stapo_verl.data.datasets import SPECS, DatasetSpec, get_spec
from stapo_verl.data.errors import DataPrepError
from stapo_verl.data.schema import JUSTRL_SUFFIX, arrow_schema, make_row, write_parquet

__all__ = ["JUSTRL_SUFFIX", "SCHEMA", "SPECS", "DataPrepError", "DatasetSpec", "arrow_schema", "get_spec", "make_row",
           "write_parquet"]


def __getattr__(name: str):
    """``SCHEMA`` is :func:`stapo_verl.data.schema.arrow_schema` (built on first access)."""
    if name == "SCHEMA":
        return arrow_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
