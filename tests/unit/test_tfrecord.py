"""Sharded TFRecord files with an offset index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from elastic_step.data import storage, tfrecord
from elastic_step.data.tfrecord import (
    ShardWriter,
    count_records,
    index_path,
    masked_crc32c,
    read_records,
)
from elastic_step.errors import InputError

RECORDS = [f"record-{i}-".encode() * (1 + i % 7) for i in range(50)]


@pytest.fixture
def shard(tmp_path: Path) -> str:
    path = str(tmp_path / "part-00000.tfrecord")
    with ShardWriter(path) as writer:
        for record in RECORDS:
            writer.write(record)
    return path


def test_crc32c_known_values() -> None:
    assert tfrecord.crc32c(b"123456789") == 0xE3069283
    assert tfrecord._crc32c_python(b"123456789") == 0xE3069283
    data = bytes(range(256)) * 3
    assert tfrecord._crc32c_python(data) == tfrecord.crc32c(data)
    assert masked_crc32c(b"") == 0xA282EAD8  # crc32c of nothing is 0; the mask adds the delta


def test_round_trip_and_count(shard: str) -> None:
    assert count_records(shard) == len(RECORDS)
    assert read_records(shard, 0, len(RECORDS)) == RECORDS


def test_middle_last_and_empty_ranges(shard: str) -> None:
    assert read_records(shard, 17, 23) == RECORDS[17:23]
    assert read_records(shard, 49, 50) == RECORDS[49:]
    assert read_records(shard, 40, 50) == RECORDS[40:]
    assert read_records(shard, 0, 1) == RECORDS[:1]
    assert read_records(shard, 10, 10) == []


def test_range_outside_the_shard(shard: str) -> None:
    with pytest.raises(InputError, match=r"record range \[45, 51\) is outside \[0, 50\)"):
        read_records(shard, 45, 51)
    with pytest.raises(InputError):
        read_records(shard, 5, 4)


def test_index_layout(shard: str) -> None:
    offsets = np.frombuffer(storage.read_bytes(index_path(shard)), dtype="<u8")
    assert len(offsets) == len(RECORDS) + 1
    assert offsets[0] == 0
    assert offsets[-1] == storage.size(shard)
    assert list(np.diff(offsets)) == [len(r) + 16 for r in RECORDS]


def test_readable_by_tensorflow(shard: str) -> None:
    got = [t.numpy() for t in tf.data.TFRecordDataset(shard)]
    assert got == RECORDS


def test_empty_shard(tmp_path: Path) -> None:
    path = str(tmp_path / "empty.tfrecord")
    with ShardWriter(path):
        pass
    assert count_records(path) == 0
    assert read_records(path, 0, 0) == []
    assert storage.size(path) == 0


def test_appended_shards_are_one_shard(shard: str, tmp_path: Path) -> None:
    """Shards joined by append_shard, after a record of its own: the records of all, in
    order, with one index, byte for byte what writing them all at once gives."""
    joined, direct = str(tmp_path / "joined.tfrecord"), str(tmp_path / "direct.tfrecord")
    with ShardWriter(joined) as writer:
        writer.write(b"first")
        writer.append_shard(shard)
        writer.append_shard(shard)
    tfrecord.write_shard(direct, [b"first", *RECORDS, *RECORDS])
    assert read_records(joined, 0, count_records(joined)) == [b"first", *RECORDS, *RECORDS]
    for path in (joined, index_path(joined)):
        assert Path(path).read_bytes() == Path(path.replace("joined", "direct")).read_bytes()


def test_writer_publishes_only_on_success(tmp_path: Path) -> None:
    path = str(tmp_path / "x.tfrecord")
    with pytest.raises(RuntimeError), ShardWriter(path) as writer:
        writer.write(b"a")
        raise RuntimeError("boom")
    assert storage.listdir(str(tmp_path)) == []


def test_read_only_the_needed_bytes(shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int, int]] = []
    real = storage.read_range

    def spy(path: str, offset: int, length: int) -> bytes:
        calls.append((path, offset, length))
        return real(path, offset, length)

    monkeypatch.setattr(storage, "read_range", spy)
    monkeypatch.setattr(storage, "read_bytes", lambda *_: pytest.fail("read a whole file"))
    assert read_records(shard, 30, 33) == RECORDS[30:33]
    assert calls[0] == (index_path(shard), 30 * 8, 4 * 8)
    (data_call,) = [c for c in calls if c[0] == shard]
    assert data_call[2] == sum(len(r) + 16 for r in RECORDS[30:33])
    assert sum(c[2] for c in calls) < storage.size(shard) // 5


def _corrupt(path: str, offset: int, byte: int = 0xFF) -> None:
    data = bytearray(storage.read_bytes(path))
    data[offset] ^= byte
    storage.write_bytes_atomic(path, bytes(data))


def _offset(shard: str, record: int) -> int:
    return int(np.frombuffer(storage.read_bytes(index_path(shard)), dtype="<u8")[record])


def test_corrupt_data_is_detected(shard: str) -> None:
    _corrupt(shard, _offset(shard, 20) + 14)  # inside record 20's data
    assert read_records(shard, 0, 20) == RECORDS[:20]  # the rest still reads
    with pytest.raises(InputError, match=rf"{shard}: record 20 is corrupt: bad data checksum"):
        read_records(shard, 18, 25)


def test_corrupt_length_is_detected(shard: str) -> None:
    _corrupt(shard, _offset(shard, 7), 0x01)
    with pytest.raises(InputError, match=rf"{shard}: record 7 is corrupt: its length"):
        read_records(shard, 7, 8)


def test_corrupt_length_checksum_is_detected(shard: str) -> None:
    _corrupt(shard, _offset(shard, 3) + 9)
    with pytest.raises(InputError, match=rf"{shard}: record 3 is corrupt: bad length checksum"):
        read_records(shard, 0, 5)


def test_the_first_bad_record_is_named_whatever_is_wrong_with_it(shard: str) -> None:
    # The frames are checked all at once; the error must still name the first bad one.
    _corrupt(shard, _offset(shard, 30) + 9)  # record 30's length checksum
    _corrupt(shard, _offset(shard, 12) + 14)  # record 12's data
    with pytest.raises(InputError, match=rf"{shard}: record 12 is corrupt: bad data checksum"):
        read_records(shard, 0, len(RECORDS))
    with pytest.raises(InputError, match=rf"{shard}: record 30 is corrupt: bad length checks"):
        read_records(shard, 13, len(RECORDS))
    assert read_records(shard, 13, 30) == RECORDS[13:30]


def test_a_shard_that_shrank_after_its_size_was_read_is_named(shard: str) -> None:
    assert read_records(shard, 45, 50) == RECORDS[45:]  # the size is now known to the process
    storage.write_bytes_atomic(shard, storage.read_bytes(shard)[:-10])
    with pytest.raises(
        InputError, match=rf"{shard}: wanted \d+ bytes at offset \d+, file ends early"
    ):
        read_records(shard, 45, 50)


def test_truncated_shard_is_detected(shard: str) -> None:
    data = storage.read_bytes(shard)
    storage.write_bytes_atomic(shard, data[:-10])
    with pytest.raises(InputError, match=r"ends at byte \d+, but the file has \d+ bytes"):
        read_records(shard, 45, 50)


def test_an_index_that_points_past_the_shard_asks_for_no_more_than_the_file_holds(
    shard: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = np.frombuffer(storage.read_bytes(index_path(shard)), dtype="<u8").copy()
    offsets[-1] = 2**60  # a corrupt index asking for an exabyte
    storage.write_bytes_atomic(index_path(shard), offsets.tobytes())
    asked: list[int] = []
    real = storage.read_range
    monkeypatch.setattr(storage, "read_range", lambda p, o, n: asked.append(n) or real(p, o, n))
    with pytest.raises(InputError, match=rf"{shard}: its index .* ends at byte {2**60}, but"):
        read_records(shard, 40, len(RECORDS))
    assert max(asked) < 1000  # only the index's offsets were read


def test_missing_or_bad_index(shard: str) -> None:
    storage.write_bytes_atomic(index_path(shard), b"\0" * 12)
    with pytest.raises(InputError, match="corrupt record index"):
        count_records(shard)
    storage.remove(index_path(shard))
    with pytest.raises(InputError, match=r"record index .* is missing"):
        count_records(shard)


def test_pure_python_crc_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without google-crc32c installed, shards still write, read and verify."""
    monkeypatch.setattr(tfrecord, "_google_crc32c", None)
    path = str(tmp_path / "py.tfrecord")
    tfrecord.write_shard(path, RECORDS[:5])
    assert read_records(path, 1, 4) == RECORDS[1:4]
    assert [t.numpy() for t in tf.data.TFRecordDataset(path)] == RECORDS[:5]


def test_a_writer_keeps_no_state_per_record(tmp_path: Path) -> None:
    """A shard of millions of records (predict's input is one shard) costs the writer no
    memory per record: the offsets go to the index file as they come."""
    import tracemalloc

    import pyarrow as pa

    path = str(tmp_path / "many.tfrecord")
    batch = pa.array([b"r%06d" % i for i in range(10_000)], pa.binary())
    tracemalloc.start()
    try:
        with ShardWriter(path) as writer:
            for _ in range(50):
                writer.write_all(batch)
            held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2_000_000, f"{held} bytes held for 500,000 records"
    assert count_records(path) == 500_000
    assert read_records(path, 499_999, 500_000) == [b"r009999"]
