"""Fixtures for the data-layer unit tests: small generated CSV files."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

COLORS = ["red", "green", "blue"]


CsvWriter = Callable[[Path, list[str], list[list[object]]], str]


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def write_csv() -> CsvWriter:
    """``write_csv(path, header, rows)`` writes a CSV file and returns its path as a string."""
    return _write_csv


@pytest.fixture
def small_csv(tmp_path: Path) -> str:
    """60 rows: numeric ``x`` and ``y``, categorical ``color`` (red most frequent), and an
    integer class label ``digit`` in 0..2."""
    rng = np.random.default_rng(1)
    rows = []
    for i in range(60):
        color = COLORS[0] if i % 2 == 0 else COLORS[1 + (i // 2) % 2]
        rows.append([round(float(rng.normal(5, 2)), 4), i, color, i % 3])
    return _write_csv(tmp_path / "small.csv", ["x", "y", "color", "digit"], rows)
