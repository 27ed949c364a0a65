"""Dataset preparation: published benchmark/training files → verl RL parquet (``python -m stapo_verl.data.prepare``)."""

from stapo_verl.data.datasets import SPECS, DatasetSpec, get_spec
from stapo_verl.data.errors import DataPrepError
from stapo_verl.data.schema import JUSTRL_SUFFIX, SCHEMA, make_row, write_parquet

__all__ = ["JUSTRL_SUFFIX", "SCHEMA", "SPECS", "DataPrepError", "DatasetSpec", "get_spec", "make_row", "write_parquet"]
