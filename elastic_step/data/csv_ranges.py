"""An uncompressed CSV file cut into byte ranges of whole rows, to be read in parallel.

A row ends at a line end outside quotes, and whether a line end is inside a quoted value
depends on every quote character before it: it is inside exactly when an odd number of them
precede it in the data (a quoted value's own quotes come in pairs: the opening and closing
ones, and each ``""`` within). So the data is read in chunks of about the same size:

1. :func:`chunk_quotes`: each chunk counts its quote characters and notes its first line end
   after an even, and after an odd, number of its own quotes;
2. :func:`row_ranges`: the counts of the chunks before a chunk say which of its two line ends
   ends a row; the range of rows that begins there runs to the next chunk's. A chunk without
   such a line end (a value longer than a chunk) adds its bytes to the range before.

The one CSV this misreads: a quote character inside an unquoted value (``ab"c``, which
RFC 4180 does not allow but readers take literally) followed, later in the file, by a quoted
value that spans lines. Arrow then reads a range from inside that value, and most likely
fails on the fields of its rows.
Tests: tests/unit/test_beam_preprocess.py (cuts that split no row, quoted line ends included).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from elastic_step.data import storage

#: About the bytes of a range: what one bundle reads at a time. A worker may run several
#: bundles at once (Prism sends up to 8 to its SDK worker), each holding its range's parse and
#: encoded records, so a range is kept small: 8 ranges of 32 MB keep a worker near 1.1 GB
#: (bench/README.md, "Preprocess benchmark"), and even a 2 M-row file makes enough ranges to
#: keep 8 bundles busy.
CHUNK_BYTES = 32 << 20
_WINDOW = 1 << 20  # bytes counted at a time
_QUOTE, _NEWLINE = ord('"'), ord("\n")


@dataclass(frozen=True)
class RowRange:
    """Bytes ``[start, end)`` of the file, whole rows; ``index`` is its place among the
    ranges, in file order."""

    index: int
    start: int
    end: int


@dataclass(frozen=True)
class ChunkQuotes:
    """What :func:`chunk_quotes` found in a chunk that begins at byte ``start``: its quote
    characters, and the end (one past the ``\\n``) of its first line after an even and after
    an odd number of them (None: no such line end)."""

    start: int
    quotes: int
    line_end_after: tuple[int | None, int | None]


def chunk_starts(data_start: int, size: int, chunk_bytes: int = CHUNK_BYTES) -> list[int]:
    """Where the chunks of the data ``[data_start, size)`` begin."""
    return list(range(data_start, max(size, data_start + 1), chunk_bytes))


def chunk_quotes(path: str, start: int, end: int) -> ChunkQuotes:
    """Reads bytes ``[start, end)`` of ``path`` and counts their quotes (see the module)."""
    quotes = 0
    found: list[int | None] = [None, None]
    with storage.open_file(path, "rb") as f:
        f.seek(start)
        offset = start
        while offset < end:
            window = f.read(min(_WINDOW, end - offset))
            if not window:
                break
            in_window = window.count(b'"')
            # Without quotes, a window's line ends all follow as many quotes as its start.
            if None in found and (in_window or found[quotes % 2] is None):
                _first_line_ends(window, offset, quotes, found)
            quotes += in_window
            offset += len(window)
    return ChunkQuotes(start=start, quotes=quotes, line_end_after=(found[0], found[1]))


def _first_line_ends(window: bytes, offset: int, quotes_before: int, found: list) -> None:
    """Fills ``found[parity]``, where still None, with the end of the first line in
    ``window`` (which begins at byte ``offset``) after ``parity`` (mod 2) quotes of the
    chunk."""
    data = np.frombuffer(window, dtype=np.uint8)
    line_ends = np.flatnonzero(data == _NEWLINE)
    # A line end is no quote: the running count there is that of the quotes before it.
    parities = (quotes_before + np.cumsum(data == _QUOTE)[line_ends]) % 2
    for parity in (0, 1):
        if found[parity] is None:
            first = np.flatnonzero(parities == parity)
            if first.size:
                found[parity] = offset + int(line_ends[first[0]]) + 1


def row_ranges(data_start: int, size: int, chunks: list[ChunkQuotes]) -> list[RowRange]:
    """The ranges of whole rows of the data ``[data_start, size)``, from its chunks' quotes
    (in any order): one per chunk, but for chunks in which no row ends, and empty ones."""
    cuts = [data_start]
    quotes = 0
    for chunk in sorted(chunks, key=lambda c: c.start):
        if chunk.start > data_start:
            line_end = chunk.line_end_after[quotes % 2]  # even in all: outside quotes
            if line_end is not None and cuts[-1] < line_end < size:
                cuts.append(line_end)
        quotes += chunk.quotes
    cuts.append(size)
    spans = [(start, end) for start, end in itertools.pairwise(cuts) if end > start]
    return [RowRange(index=i, start=start, end=end) for i, (start, end) in enumerate(spans)]
