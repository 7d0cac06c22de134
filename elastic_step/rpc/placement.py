"""Which PS shard holds what: dense variables by a stable hash of their name, embedding rows
by id. Workers, PS and master all place with these functions, so they agree.
Tests: tests/unit/test_ps.py (placement)."""

from __future__ import annotations

import zlib

import numpy as np


def shard_of_variable(name: str, num_ps: int) -> int:
    # crc32, unlike hash(), is the same in every process and Python version.
    return zlib.crc32(name.encode("utf-8")) % num_ps


def shard_of_rows(ids: np.ndarray, num_ps: int) -> np.ndarray:
    return ids % num_ps


def local_rows(ids: np.ndarray, num_ps: int) -> np.ndarray:
    """Row ids as indices into the owning shard's part of the table."""
    return ids // num_ps


def rows_owned(total_rows: int, shard: int, num_ps: int) -> int:
    """How many of a table's rows shard ``shard`` holds."""
    return len(range(shard, total_rows, num_ps))
