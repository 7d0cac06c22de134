"""Sharded TFRecord files with an offset index, for O(range) random access.

A shard ``PATH`` is a standard TFRecord file (readable by ``tf.data.TFRecordDataset``): each
record is framed as

    uint64 LE length | uint32 LE masked crc32c(length bytes) | data | uint32 LE masked crc32c(data)

Beside it, ``PATH.index`` holds ``n + 1`` little-endian uint64 byte offsets: the start of each
record, then the end of the file. Counting records and reading records ``[start, end)`` then
cost two small ranged reads, never a scan from the start of the file.

All I/O goes through :mod:`elastic_step.data.storage`.
"""

from __future__ import annotations

import functools
import shutil
import uuid
from collections.abc import Callable
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from elastic_step.data import storage
from elastic_step.errors import InputError

try:  # A C implementation when it happens to be installed; the table below is the fallback.
    import google_crc32c as _google_crc32c
except ImportError:  # pragma: no cover - depends on the environment
    _google_crc32c = None

INDEX_SUFFIX = ".index"
_HEADER = 12  # uint64 length + uint32 crc of the length
_FOOTER = 4  # uint32 crc of the data
_MASK_DELTA = 0xA282EAD8
_COPY_BYTES = 8 << 20  # bytes copied at a time by ShardWriter.append_shard


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def _crc32c_python(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


#: The CRC-32C (Castagnoli) checksum of a ``bytes``: the C implementation where it is
#: installed, chosen once here, since the reader and writer call it once per record.
crc32c: Callable[[bytes], int] = (
    _google_crc32c.value if _google_crc32c is not None else _crc32c_python
)


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C that TFRecord framing stores (rotated right by 15, plus a delta)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


_TABLE_ARRAY = np.array(_TABLE, dtype=np.uint32)


def _crc32c_of_uint64(values: np.ndarray) -> np.ndarray:
    """The CRC-32C of each of ``values`` as 8 little-endian bytes, for all of them at once."""
    crc = np.full(len(values), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        byte = ((values >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.uint32)
        crc = _TABLE_ARRAY[(crc ^ byte) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def _masked(crcs: np.ndarray) -> np.ndarray:
    """:func:`masked_crc32c` of every CRC in ``crcs`` (uint32), as little-endian uint32."""
    crcs = crcs.astype(np.uint64)
    rotated = ((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) & np.uint64(0xFFFFFFFF)
    return ((rotated + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)).astype("<u4")


def _fixed_rows(rows: np.ndarray) -> pa.Array:
    """A large_binary array of the rows of the 2-D uint8 array ``rows``."""
    n, width = rows.shape
    fixed = pa.Array.from_buffers(
        pa.binary(width), n, [None, pa.py_buffer(np.ascontiguousarray(rows))]
    )
    return fixed.cast(pa.large_binary())


def index_path(path: str) -> str:
    """The offset-index file of shard ``path``."""
    return path + INDEX_SUFFIX


class ShardWriter:
    """Writes one TFRecord shard and, on :meth:`close`, its offset index.

    Records and their offsets stream into temporary files beside ``path`` and its index
    (memory stays flat however many records a shard holds), renamed into place on close: the
    shard, then its index; a reader never sees a half-written shard. If the ``with`` block
    raises, the temporary files are removed and nothing is published.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        suffix = f".tmp-{uuid.uuid4().hex[:8]}"
        self._tmp, self._index_tmp = path + suffix, index_path(path) + suffix
        self._file = storage.open_file(self._tmp, "wb")
        try:
            self._index = storage.open_file(self._index_tmp, "wb")
        except BaseException:  # nothing left behind
            self._file.close()
            storage.remove(self._tmp)
            raise
        self._index.write(np.zeros(1, "<u8").tobytes())
        self._records = 0
        self._end = 0  # the offset after the last record
        self._closed = False

    @property
    def records(self) -> int:
        """How many records were written so far."""
        return self._records

    def _add_offsets(self, ends: np.ndarray) -> None:
        """Records the end offsets of records just written (relative to the shard's end)."""
        offsets = self._end + ends.astype(np.int64)
        self._index.write(offsets.astype("<u8").tobytes())
        self._records += len(offsets)
        self._end = int(offsets[-1])

    def write(self, record: bytes) -> None:
        """Appends one record."""
        self.write_all(pa.array([record], pa.binary()))

    def write_all(self, records: pa.Array) -> None:
        """Appends the records of the Arrow binary array ``records``, in order, in one write.

        The frames are built for all records at once: lengths and their checksums by numpy,
        the frames joined by Arrow; only the data checksums take a call per record.
        """
        if self._closed:
            raise ValueError(f"{self.path}: write after close")
        n = len(records)
        if n == 0:
            return
        records = records.cast(pa.large_binary())
        offsets = np.frombuffer(records.buffers()[1], dtype="<i8")[
            records.offset : records.offset + n + 1
        ]
        data = records.buffers()[2].to_pybytes()  # google_crc32c takes bytes, not views
        starts, ends = offsets[:-1].tolist(), offsets[1:].tolist()
        lengths = np.diff(offsets).astype("<u8")
        headers = np.empty((n, _HEADER), dtype=np.uint8)
        headers[:, :8] = lengths.view(np.uint8).reshape(n, 8)
        headers[:, 8:] = _masked(_crc32c_of_uint64(lengths)).view(np.uint8).reshape(n, 4)
        data_crcs = np.fromiter(
            (crc32c(data[a:b]) for a, b in zip(starts, ends, strict=True)),
            dtype=np.uint32,
            count=n,
        )
        footers = _masked(data_crcs).view(np.uint8).reshape(n, 4)
        framed = pc.binary_join_element_wise(
            _fixed_rows(headers), records, _fixed_rows(footers), pa.scalar(b"", pa.large_binary())
        )
        framed_offsets = np.frombuffer(framed.buffers()[1], dtype="<i8")[: n + 1]
        self._file.write(
            memoryview(framed.buffers()[2])[int(framed_offsets[0]) : int(framed_offsets[-1])]
        )
        self._add_offsets(np.cumsum(lengths + _HEADER + _FOOTER))

    def append_shard(self, path: str) -> None:
        """Appends the records of the shard ``path`` (with its index), copying their frames as
        they are."""
        if self._closed:
            raise ValueError(f"{self.path}: write after close")
        offsets = np.frombuffer(storage.read_bytes(index_path(path)), dtype="<u8")
        with storage.open_file(path, "rb") as f:
            shutil.copyfileobj(f, self._file, _COPY_BYTES)
        if len(offsets) > 1:
            self._add_offsets(offsets[1:])

    def close(self) -> None:
        """Publishes the shard, then its index. Closing twice is a no-op."""
        if self._close_files():
            store = storage.storage_for(self.path)
            store.rename(self._tmp, self.path)
            store.rename(self._index_tmp, index_path(self.path))

    def abort(self) -> None:
        """Drops what was written; nothing is published."""
        if self._close_files():
            storage.remove(self._tmp)
            storage.remove(self._index_tmp)

    def _close_files(self) -> bool:
        """Closes the temporary files; False when they were closed already."""
        if self._closed:
            return False
        self._closed = True
        self._file.close()
        self._index.close()
        return True

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_shard(path: str, records: list[bytes]) -> int:
    """Writes ``records`` as one shard at ``path``; returns how many were written."""
    with ShardWriter(path) as writer:
        writer.write_all(pa.array(records, pa.binary()))
    return len(records)


def count_records(path: str) -> int:
    """The number of records in shard ``path``, from the size of its index (O(1))."""
    index = index_path(path)
    if not storage.exists(index):
        raise InputError(f"{path}: the record index {index} is missing")
    size = storage.size(index)
    if size < 8 or size % 8:
        raise InputError(f"{index}: corrupt record index ({size} bytes, not n+1 uint64 offsets)")
    return size // 8 - 1


@functools.lru_cache(maxsize=4096)
def _shard_size(path: str) -> int:
    """A shard's size; asked once per process, as a shard never changes once written."""
    return storage.size(path)


def read_records(path: str, start: int, end: int) -> list[bytes]:
    """Records ``[start, end)`` of shard ``path``, in order.

    Reads ``end - start + 1`` offsets from the index and one contiguous byte range of the
    shard, so the cost is proportional to the range, not the file. Every frame's length and
    both checksums are verified; corruption raises an :class:`InputError` naming the file and
    the record.
    """
    total = count_records(path)
    if not 0 <= start <= end <= total:
        raise InputError(f"{path}: record range [{start}, {end}) is outside [0, {total})")
    if start == end:
        return []
    raw = storage.read_range(index_path(path), start * 8, (end - start + 1) * 8)
    offsets = np.frombuffer(raw, dtype="<u8").astype(np.int64)
    base = int(offsets[0])
    if base < 0 or np.any(np.diff(offsets) < _HEADER + _FOOTER):
        raise InputError(f"{index_path(path)}: corrupt record index near record {start}")
    if int(offsets[-1]) > _shard_size(path):  # never ask for more than the file holds
        raise InputError(
            f"{path}: its index {index_path(path)} says record {end - 1} ends at byte "
            f"{int(offsets[-1])}, but the file has {_shard_size(path)} bytes (the file is "
            "truncated, or the index is not its own)"
        )
    data = storage.read_range(path, base, int(offsets[-1]) - base)
    return _checked_records(path, start, data, offsets - base)


def _checked_records(path: str, start: int, data: bytes, offsets: np.ndarray) -> list[bytes]:
    """The records framed in ``data`` at ``offsets`` (the index's, made relative to
    ``data``; one more than the records), every length and checksum checked at once in
    numpy, with one C call per record for the data's CRC. A worker reads a task's records in
    a background thread while it trains: checked one record at a time in Python, a task of
    4,096 records took 9-17 ms of that thread, holding the GIL, against 3-4 ms now.
    Raises :class:`InputError` naming the first bad record (``start``: the first's number)."""
    frame = np.frombuffer(data, dtype=np.uint8)
    lo, hi = offsets[:-1], offsets[1:]
    lengths = frame[lo[:, None] + np.arange(8)].view("<u8").ravel()
    length_crcs = frame[lo[:, None] + np.arange(8, _HEADER)].view("<u4").ravel()
    data_crcs = frame[(hi - _FOOTER)[:, None] + np.arange(_FOOTER)].view("<u4").ravel()
    starts, stops = (lo + _HEADER).tolist(), (hi - _FOOTER).tolist()
    records = [data[a:b] for a, b in zip(starts, stops, strict=True)]
    computed = np.fromiter(map(crc32c, records), np.uint32, len(records))
    checks = [
        (lengths.astype(np.int64) + _HEADER + _FOOTER != hi - lo, "its length {} does not "
         "match the index ({} bytes)"),
        (_masked(_crc32c_of_uint64(lengths)) != length_crcs, "bad length checksum"),
        (_masked(computed) != data_crcs, "bad data checksum"),
    ]  # fmt: skip
    bad = [(int(np.argmax(failed)), n) for n, (failed, _) in enumerate(checks) if failed.any()]
    if bad:
        i, check = min(bad)
        why = checks[check][1].format(int(lengths[i]), int(hi[i] - lo[i]) - _HEADER - _FOOTER)
        raise InputError(f"{path}: record {start + i} is corrupt: {why}")
    return records
