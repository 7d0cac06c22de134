"""Records parked in buckets, for a shuffle larger than memory.

The encoding pass sends each record, with its random sort key, to a bucket; the writing pass
reads one bucket at a time back, sorts it by key and appends it to its shard. Records wait in
memory until ``flush_bytes`` of them are pending, then every bucket's pending records are
written as one block:

    uint64 n | n x uint64 keys | (n + 1) x uint64 offsets | data

Two places hold the blocks: :class:`Spill`, a file per bucket on local disk (the
single-machine path), and :class:`RangeParts`, one file per range of the input on any storage,
with an index of where each bucket's blocks lie (the Beam path: each range parks its own
records, and the step that writes a bucket reads its blocks from every range's file, so that no
step holds more than a bucket).
Tests: tests/unit/test_preprocess_streaming.py (tiny memory budgets, a CSV larger than memory),
tests/unit/test_beam_preprocess.py.
"""

from __future__ import annotations

import contextlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import IO

import numpy as np
import pyarrow as pa

from elastic_step.data import storage

FLUSH_BYTES = 32 << 20


def write_block(f: IO[bytes], keys: np.ndarray, records: pa.Array) -> tuple[int, int]:
    """Writes ``records`` with their ``keys`` to ``f`` as one block; ``(bytes written, record
    bytes)``."""
    keys = keys.astype("<u8")
    records = records.cast(pa.large_binary())
    offsets = np.frombuffer(records.buffers()[1], dtype="<i8")[
        records.offset : records.offset + len(records) + 1
    ]
    base, end = int(offsets[0]), int(offsets[-1])
    parts = [
        np.array([len(keys)], dtype="<u8").tobytes(),
        keys.tobytes(),
        (offsets - base).astype("<u8").tobytes(),
        memoryview(records.buffers()[2])[base:end],
    ]
    for part in parts:
        f.write(part)
    return sum(len(part) for part in parts), end - base


def read_blocks(f: IO[bytes]) -> Iterator[tuple[np.ndarray, pa.Array]]:
    """``(keys, records)`` of each block in ``f``, to its end."""
    while header := f.read(8):
        n = int(np.frombuffer(header, dtype="<u8")[0])
        keys = np.frombuffer(f.read(8 * n), dtype="<u8")
        offsets = np.frombuffer(f.read(8 * (n + 1)), dtype="<i8")
        data = f.read(int(offsets[-1]))
        yield (
            keys,
            pa.Array.from_buffers(
                pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
            ),
        )


class _Parked(ABC):
    """Records held per bucket until ``flush_bytes`` of them are pending, then written a
    block per bucket (:meth:`_write`)."""

    def __init__(self, flush_bytes: int) -> None:
        self._flush_bytes = flush_bytes
        self._pending: dict[int, list[tuple[np.ndarray, pa.Array]]] = {}
        self._pending_bytes = 0
        self.bytes_written = 0  # record bytes in all blocks

    def add(self, buckets: np.ndarray, keys: np.ndarray, records: pa.Array) -> None:
        """Sends ``records[i]``, with sort key ``keys[i]``, to bucket ``buckets[i]``."""
        for bucket, bucket_keys, part in by_bucket(buckets, keys, records):
            self._pending.setdefault(bucket, []).append((bucket_keys, part))
            self._pending_bytes += part.nbytes
        if self._pending_bytes >= self._flush_bytes:
            self.flush()

    def flush(self) -> None:
        """Writes every pending record, a block per bucket."""
        for bucket, parts in sorted(self._pending.items()):
            keys = np.concatenate([k for k, _ in parts])
            self.bytes_written += self._write(bucket, keys, pa.concat_arrays([r for _, r in parts]))
        self._pending.clear()
        self._pending_bytes = 0

    @abstractmethod
    def _write(self, bucket: int, keys: np.ndarray, records: pa.Array) -> int:
        """Writes one block of ``bucket``; its record bytes."""


class Spill(_Parked):
    """``buckets`` bucket files in the local directory ``directory``."""

    def __init__(self, directory: str, buckets: int, *, flush_bytes: int = FLUSH_BYTES) -> None:
        super().__init__(flush_bytes)
        self._directory = directory
        self.buckets = buckets

    def _path(self, bucket: int) -> str:
        return os.path.join(self._directory, f"bucket-{bucket:06d}")

    def _write(self, bucket: int, keys: np.ndarray, records: pa.Array) -> int:
        with open(self._path(bucket), "ab") as f:
            return write_block(f, keys, records)[1]

    def sorted_bucket(self, bucket: int) -> pa.Array:
        """The records of ``bucket`` in the order of their keys (after :meth:`flush`)."""
        path = self._path(bucket)
        if not os.path.exists(path):
            return pa.array([], pa.large_binary())
        with open(path, "rb") as f:
            return _in_key_order(read_blocks(f))


#: Where one block of a bucket lies in a range's file: ``(path, offset, length)``.
BlockPlace = tuple[str, int, int]


class RangeParts(_Parked):
    """One range's records in one file ``path`` (any storage, written front to back), and
    where each bucket's blocks lie in it (:attr:`index`). Use as a context manager: the file
    appears, complete, when it closes without an error (a runner that runs a range twice, on
    a retry or as a backup, never shows a reader half a file)."""

    def __init__(self, path: str, *, flush_bytes: int = FLUSH_BYTES) -> None:
        super().__init__(flush_bytes)
        self.path = path
        self.index: dict[int, list[BlockPlace]] = {}
        self._written = 0
        self._file: IO[bytes] | None = None
        self._open = contextlib.ExitStack()

    def __enter__(self) -> RangeParts:
        self._file = self._open.enter_context(storage.open_atomic(self.path))
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            try:
                self.flush()
            except BaseException as e:  # the file is not published
                self._open.__exit__(type(e), e, e.__traceback__)
                raise
        return self._open.__exit__(kind, error, traceback)

    def _write(self, bucket: int, keys: np.ndarray, records: pa.Array) -> int:
        assert self._file is not None, "RangeParts is used as a context manager"
        length, record_bytes = write_block(self._file, keys, records)
        self.index.setdefault(bucket, []).append((self.path, self._written, length))
        self._written += length
        return record_bytes


def sorted_blocks(places: list[BlockPlace]) -> pa.Array:
    """The records of the blocks at ``places`` (:class:`RangeParts`), in the order of their
    keys: one bucket, read from every range that sent it records."""
    return _in_key_order(
        block
        for path, offset, length in places
        for block in read_blocks(io.BytesIO(storage.read_range(path, offset, length)))
    )


def _in_key_order(blocks: Iterable[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    pairs = list(blocks)
    return in_key_order([keys for keys, _ in pairs], [records for _, records in pairs])


def by_bucket(
    buckets: np.ndarray, keys: np.ndarray, records: pa.Array
) -> Iterator[tuple[int, np.ndarray, pa.Array]]:
    """``(bucket, keys, records)`` of each bucket in ``buckets``, in bucket order: the rows
    sent to it, in their order in ``records``."""
    order = np.argsort(buckets, kind="stable")
    sorted_buckets = buckets[order]
    starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
    ends = np.r_[starts[1:], len(order)]
    taken = records.take(pa.array(order))
    for start, end in zip(starts, ends, strict=True):
        yield int(sorted_buckets[start]), keys[order[start:end]], taken.slice(start, end - start)


def in_key_order(keys: list[np.ndarray], blocks: list[pa.Array]) -> pa.Array:
    """The records of all ``blocks`` sorted by their keys (``keys[i]`` are those of
    ``blocks[i]``'s records); a bucket in the order its shard holds it."""
    if not blocks:
        return pa.array([], pa.large_binary())
    order = np.argsort(np.concatenate(keys), kind="stable")
    return pa.concat_arrays([b.cast(pa.large_binary()) for b in blocks]).take(pa.array(order))
