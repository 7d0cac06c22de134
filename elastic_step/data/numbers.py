"""Text columns read as numbers, whole batches at a time, finding the first value that is not one.

A number is what Arrow's string-to-double cast accepts and is finite: ``1``, ``-2.5``,
``1e5``, ``.5``; not ``nan``, ``inf``, ``1,5`` or ``0x10``. An empty value is missing.
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
    """``(floats, first_bad)``: float64 values with nulls where ``values`` is empty, and the
    index of the first non-empty value that is not a number (None if there is none; then
    ``floats`` is complete)."""
    with_nulls = pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
    try:
        floats = pc.cast(with_nulls, pa.float64())
    except pa.ArrowInvalid:
        return pa.nulls(len(values), pa.float64()), _first_failing_cast(with_nulls)
    # is_finite is null where the value is missing; first_true skips nulls.
    return floats, first_true(pc.invert(pc.is_finite(floats)))


def is_number(text: str) -> bool:
    """Whether one (stripped, non-empty) value is a number."""
    return to_numbers(pa.array([text], pa.string()))[1] is None


def exact_sum(values: np.ndarray) -> Fraction:
    """The sum of the float64 ``values`` without rounding, so that sums of batches add up to the
    same total however the values were batched.

    Each value is an integer mantissa times a power of two; the mantissas are summed exactly
    in int64 per power (split in halves so that the sums cannot overflow).
    """
    if values.size == 0:
        return Fraction(0)
    mantissas, exponents = np.frexp(values)
    integers = (mantissas * float(1 << 53)).astype(np.int64)  # exact: |mantissa| < 1
    order = np.argsort(exponents, kind="stable")
    exponents, integers = exponents[order], integers[order]
    starts = np.flatnonzero(np.r_[True, exponents[1:] != exponents[:-1]])
    high = integers >> 26
    low = integers - (high << 26)
    total = Fraction(0)
    for exponent, high_sum, low_sum in zip(
        exponents[starts].tolist(),
        np.add.reduceat(high, starts).tolist(),
        np.add.reduceat(low, starts).tolist(),
        strict=True,
    ):
        total += Fraction((high_sum << 26) + low_sum) * Fraction(2) ** (exponent - 53)
    return total
