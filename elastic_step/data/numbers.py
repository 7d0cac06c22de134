"""Text columns read as numbers, whole batches at a time, finding the first value that is not one.

A number is what Arrow's string-to-double cast accepts and is finite: ``1``, ``-2.5``,
``1e5``, ``.5``; not ``nan``, ``inf``, ``1,5`` or ``0x10``. An empty value is missing.
"""

from __future__ import annotations

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
