"""Journal segments: files of framed records, named after the first sequence number they hold.

A frame is ``crc32 | length | seq | payload``: the CRC (4 bytes, little-endian) covers the
length (4 bytes), the sequence number (8 bytes) and the payload, the record's compact JSON.
A crash mid-write leaves a torn last frame: short, or failing its CRC. Reading stops at the
first such frame; the next owner truncates the file there before appending.

Segment ``journal-<first seq>.log`` holds records numbered below the next segment's first
seq; zero-padded names sort in order.
Tests: tests/unit/test_state_store.py (a crash at every byte, a damaged last record).
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from dataclasses import dataclass

from elastic_step.master.state_store.api import StateStoreError
from elastic_step.master.state_store.local_files import fsync_dir, write_all

_CRC = struct.Struct("<I")
_HEAD = struct.Struct("<IQ")  # payload length, seq
FRAME_OVERHEAD = _CRC.size + _HEAD.size
_NAME = re.compile(r"journal-(\d{20})\.log")
# Compact, and the same bytes for the same record; not json.dumps(separators=...), which
# builds a new encoder at every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def segment_name(first_seq: int) -> str:
    return f"journal-{first_seq:020d}.log"


def list_segments(directory: str) -> list[tuple[int, str]]:
    """``(first seq, path)`` of every segment in ``directory``, in order."""
    found = []
    for name in os.listdir(directory):
        match = _NAME.fullmatch(name)
        if match:
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def encode_json(value: dict) -> bytes:
    return _ENCODER.encode(value).encode()


def encode_frame(seq: int, record: dict) -> bytes:
    payload = encode_json(record)
    body = _HEAD.pack(len(payload), seq) + payload
    return _CRC.pack(zlib.crc32(body)) + body


@dataclass(frozen=True)
class Frame:
    offset: int
    seq: int
    record: dict


@dataclass(frozen=True)
class Scan:
    frames: list[Frame]
    #: Bytes up to the end of the last good frame.
    good_length: int
    #: Why reading stopped before the end of the data; None when it did not.
    problem: str | None


def scan_frames(data: bytes) -> Scan:
    """The good frames at the start of ``data``, up to the first torn or corrupt one."""
    frames = []
    offset = 0
    while offset < len(data):
        if len(data) - offset < FRAME_OVERHEAD:
            return Scan(frames, offset, "a torn frame header")
        (crc,) = _CRC.unpack_from(data, offset)
        length, seq = _HEAD.unpack_from(data, offset + _CRC.size)
        end = offset + FRAME_OVERHEAD + length
        if end > len(data):
            return Scan(frames, offset, "a torn record")
        if zlib.crc32(memoryview(data)[offset + _CRC.size : end]) != crc:
            return Scan(frames, offset, "a record failing its CRC")
        try:
            record = json.loads(data[offset + FRAME_OVERHEAD : end])
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return Scan(frames, offset, "a record that is not a JSON object")
        frames.append(Frame(offset, seq, record))
        offset = end
    return Scan(frames, offset, None)


class SegmentWriter:
    """Appends frames to one segment and makes them durable."""

    def __init__(self, directory: str, first_seq: int) -> None:
        self.first_seq = first_seq
        self.path = os.path.join(directory, segment_name(first_seq))
        created = not os.path.exists(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if created:  # records in it are durable only once its name is
            fsync_dir(directory)

    def write(self, records: list[tuple[int, dict]]) -> None:
        """Writes ``(seq, record)`` pairs with one write and one fsync.

        A record that is not JSON-ready raises StateStoreError after the ones before it are
        written, so the journal keeps every record appended before the bad one.
        """
        frames = []
        error = None
        for seq, record in records:
            try:
                frames.append(encode_frame(seq, record))
            except (TypeError, ValueError) as e:
                error = StateStoreError(f"record {seq} is not JSON-ready: {e}")
                break
        if frames:
            write_all(self._fd, b"".join(frames))
            os.fsync(self._fd)
        if error is not None:
            raise error

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
