"""Errors raised while preparing datasets."""

from __future__ import annotations


class DataPrepError(ValueError):
    """A dataset cannot be prepared: unknown name, unreadable source, missing column or empty answer.

    Args:
        message: what is wrong and what is allowed.
        file: the source file (or HF id) being read, if known.
        row: the 0-based row (JSONL: line number − 1) in that file, if known.
    """

    def __init__(self, message: str, file: str | None = None, row: int | None = None) -> None:
        self.file, self.row = file, row
        where = ""
        if file is not None:
            where = f" [file {file}" + (f", row {row}" if row is not None else "") + "]"
        super().__init__(message + where)
