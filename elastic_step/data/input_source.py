"""The input of ``preprocess`` and ``predict``: a CSV file, or Parquet files. Both read as
batches of columns (:class:`elastic_step.data.csv_source.CsvBatch`) and say where a row is
for error messages (``where``); Parquet also says its columns' kinds (``kinds``).
Tests: tests/unit/test_parquet_input.py, tests/unit/test_preprocess_streaming.py."""

from __future__ import annotations

from elastic_step.data import storage
from elastic_step.data.csv_source import BATCH_BYTES, BLOCK_BYTES, CsvSource
from elastic_step.data.parquet_source import ParquetSource, is_parquet
from elastic_step.errors import InputError

Source = CsvSource | ParquetSource


def open_source(
    path: str, *, block_bytes: int = BLOCK_BYTES, batch_bytes: int = BATCH_BYTES
) -> Source:
    """Parquet when ``path`` is a directory, a glob, a ``*.parquet`` (``*.pq``) file or a
    file in Parquet's format; else a CSV file."""
    if is_parquet(path):
        return ParquetSource(path, batch_bytes=batch_bytes)
    if not storage.exists(path):
        raise InputError(f"{path}: file not found")
    return CsvSource(path, block_bytes=block_bytes, batch_bytes=batch_bytes)
