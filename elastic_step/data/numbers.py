"""Text columns read as numbers, whole batches at a time, finding the first value that is not one.

A number is what Arrow's string-to-double cast accepts and is finite: ``1``, ``-2.5``,
``1e5``, ``.5``; not ``nan``, ``inf``, ``1,5`` or ``0x10``. An empty value is missing.
Tests: tests/unit/test_preprocess.py, tests/unit/test_preprocess_streaming.py (via preprocess).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def first_true(mask: pa.Array) -> int | None:
    """The index of the first true value of the boolean array ``mask``, else None."""
    index = pc.index(mask, True).as_py()
    return None if index < 0 else index


def _first_failing_cast(values: pa.Array) -> int:
    """The index of the first value the cast refuses, knowing that the cast of all fails."""
    lo, hi = 0, len(values)  # the first refused value is in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(values.slice(lo, mid - lo), pa.float64())
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo


def to_numbers(values: pa.Array) -> tuple[pa.Array, int | None]:
    """``(floats, first_bad)``: float64 values with nulls where ``values`` is empty (or blank),
    and the index of the first other value that is not a number (None if there is none; then
    ``floats`` is complete). Surrounding whitespace is ignored."""
    try:
        floats = pc.cast(values, pa.float64())  # most columns: no blanks, no spaces
    except pa.ArrowInvalid:
        trimmed = pc.utf8_trim_whitespace(values)
        values = pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, pa.string()), trimmed)
        try:
            floats = pc.cast(values, pa.float64())
        except pa.ArrowInvalid:
            return pa.nulls(len(values), pa.float64()), _first_failing_cast(values)
    numbers = floats.to_numpy(zero_copy_only=False)  # NaN where null
    infinite = ~np.isfinite(numbers)
    if floats.null_count:
        infinite &= floats.is_valid().to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(infinite)
    return floats, int(bad[0]) if bad.size else None


def as_text(values: pa.Array) -> pa.Array:
    """A column's values as categorical text: strings stripped of surrounding whitespace (as
    a CSV's cells are read), numbers of a Parquet column in Arrow's spelling (``3``,
    ``2.5``), an empty value where there is none."""
    if not pa.types.is_string(values.type):
        values = pc.fill_null(pc.cast(values, pa.string()), "")
    return pc.utf8_trim_whitespace(values)


def is_number(text: str) -> bool:
    """Whether one (stripped, non-empty) value is a number."""
    return to_numbers(pa.array([text], pa.string()))[1] is None


class ExactSum:
    """A sum of float64 values without rounding, so that batches add up to the same total
    however the values were batched.

    Each value is an integer mantissa (53 bits) times a power of two. Mantissas are cut in
    three 21-bit pieces whose sums per power, over fewer than 2**32 values, are integers below
    2**53: float64 adds them exactly, and numpy's bincount adds them fast.
    """

    def __init__(self) -> None:
        self._by_exponent: dict[int, int] = {}

    def add(self, values: np.ndarray) -> None:
        if values.size == 0:
            return
        mantissas, exponents = np.frexp(values)
        integers = (mantissas * float(1 << 53)).astype(np.int64)  # exact: |mantissa| < 1
        base = int(exponents.min())
        bins = exponents - base
        pieces = (integers & 0x1FFFFF, (integers >> 21) & 0x1FFFFF, integers >> 42)
        sums = [np.bincount(bins, weights=p.astype(np.float64)) for p in pieces]
        for offset in np.flatnonzero(np.bincount(bins)).tolist():
            low, middle, high = (int(s[offset]) for s in sums)
            exponent = base + offset
            self._by_exponent[exponent] = (
                self._by_exponent.get(exponent, 0) + low + (middle << 21) + (high << 42)
            )

    def merge(self, other: ExactSum) -> None:
        """Adds the values that ``other`` summed."""
        for exponent, total in other._by_exponent.items():
            self._by_exponent[exponent] = self._by_exponent.get(exponent, 0) + total

    def value(self) -> Fraction:
        return sum(
            (Fraction(total) * Fraction(2) ** (exponent - 53)
             for exponent, total in self._by_exponent.items()),
            Fraction(0),
        )  # fmt: skip
