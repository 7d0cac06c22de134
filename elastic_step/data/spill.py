"""Records parked on local disk in buckets, for a shuffle larger than memory.

The encoding pass sends each record, with its random sort key, to a bucket; the writing pass
reads one bucket at a time back, sorts it by key and appends it to its shard. Records wait in
memory until ``flush_bytes`` of them are pending, then every bucket's pending records are
appended to its file as one block:

    uint64 n | n x uint64 keys | (n + 1) x uint64 offsets | data

Tests: tests/unit/test_preprocess_streaming.py (tiny memory budgets, a CSV larger than memory).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

FLUSH_BYTES = 32 << 20


class Spill:
    """``buckets`` bucket files in the local directory ``directory``."""

    def __init__(self, directory: str, buckets: int, *, flush_bytes: int = FLUSH_BYTES) -> None:
        self._directory = directory
        self._flush_bytes = flush_bytes
        self._pending: dict[int, list[tuple[np.ndarray, pa.Array]]] = {}
        self._pending_bytes = 0
        self.buckets = buckets
        self.bytes_written = 0  # record bytes in all bucket files

    def _path(self, bucket: int) -> str:
        return os.path.join(self._directory, f"bucket-{bucket:06d}")

    def add(self, buckets: np.ndarray, keys: np.ndarray, records: pa.Array) -> None:
        """Sends ``records[i]``, with sort key ``keys[i]``, to bucket ``buckets[i]``."""
        for bucket, bucket_keys, part in by_bucket(buckets, keys, records):
            self._pending.setdefault(bucket, []).append((bucket_keys, part))
            self._pending_bytes += part.nbytes
        if self._pending_bytes >= self._flush_bytes:
            self.flush()

    def flush(self) -> None:
        """Appends every pending record to its bucket's file."""
        for bucket, parts in sorted(self._pending.items()):
            keys = np.concatenate([k for k, _ in parts]).astype("<u8")
            records = pa.concat_arrays([r for _, r in parts]).cast(pa.large_binary())
            offsets = np.frombuffer(records.buffers()[1], dtype="<i8")[
                records.offset : records.offset + len(records) + 1
            ]
            data = records.buffers()[2]
            base, end = int(offsets[0]), int(offsets[-1])
            with open(self._path(bucket), "ab") as f:
                f.write(np.array([len(keys)], dtype="<u8").tobytes())
                f.write(keys.tobytes())
                f.write((offsets - base).astype("<u8").tobytes())
                f.write(memoryview(data)[base:end])
            self.bytes_written += end - base
        self._pending.clear()
        self._pending_bytes = 0

    def sorted_bucket(self, bucket: int) -> pa.Array:
        """The records of ``bucket`` in the order of their keys (after :meth:`flush`)."""
        path = self._path(bucket)
        if not os.path.exists(path):
            return pa.array([], pa.large_binary())
        keys, blocks = [], []
        with open(path, "rb") as f:
            while header := f.read(8):
                n = int(np.frombuffer(header, dtype="<u8")[0])
                keys.append(np.frombuffer(f.read(8 * n), dtype="<u8"))
                offsets = np.frombuffer(f.read(8 * (n + 1)), dtype="<i8")
                data = f.read(int(offsets[-1]))
                blocks.append(
                    pa.Array.from_buffers(
                        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
                    )
                )
        return in_key_order(keys, blocks)


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
