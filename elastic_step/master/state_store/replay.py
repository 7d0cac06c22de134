"""Reading the file store's directory back: the snapshot, then the journal records after it.

The rules, which the writer's order of operations relies on:

* the snapshot (``seq`` S) covers every record numbered S or below; records after it must run
  S+1, S+2, ... without a gap;
* a segment followed by one whose first seq is S+1 or below holds only covered records: it is
  not even read (a crash between a snapshot's rename and the deletion of these segments
  leaves them behind, harmlessly);
* replay stops at the first torn or corrupt frame, or at a gap, and ignores everything after.

A reader needs no lease: if the snapshot was replaced while it read (the owner compacted
underneath it), it reads again.
Tests: tests/unit/test_state_store.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from elastic_step.master.state_store.api import Replayed, StateStoreError
from elastic_step.master.state_store.journal import list_segments, scan_frames

SNAPSHOT_FILE = "snapshot.json"
SNAPSHOT_FORMAT = 2
_ATTEMPTS = 20


@dataclass(frozen=True)
class Cut:
    """Where the good journal ends before the end of the files."""

    path: str
    offset: int
    problem: str
    #: Later segments, unreachable past the cut.
    dropped: list[str]


@dataclass(frozen=True)
class Replay(Replayed):
    #: Segments whose records the snapshot all covers.
    covered: list[str] = field(default_factory=list)
    cut: Cut | None = None


class _Changed(Exception):
    """The owner changed the directory while it was read."""


def read_directory(directory: str) -> Replay:
    path = os.path.join(directory, SNAPSHOT_FILE)
    for _ in range(_ATTEMPTS):
        before = _identity(path)
        try:
            replay = _read(directory, path)
        except _Changed:
            continue
        if _identity(path) == before:
            return replay
    raise StateStoreError(
        f"{directory} kept changing while it was read ({_ATTEMPTS} attempts); try again"
    )


def _identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read(directory: str, snapshot_path: str) -> Replay:
    snapshot, last = _read_snapshot(snapshot_path)
    snapshot_seq = last
    records: list[dict] = []
    covered = []
    segments = list_segments(directory)
    for i, (_, path) in enumerate(segments):
        if i + 1 < len(segments) and segments[i + 1][0] - 1 <= snapshot_seq:
            covered.append(path)
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise _Changed() from None
        scan = scan_frames(data)
        stop: tuple[int, str] | None = None
        for frame in scan.frames:
            if frame.seq <= snapshot_seq and last == snapshot_seq:
                continue  # covered by the snapshot
            if frame.seq != last + 1:
                stop = frame.offset, f"record {frame.seq} where {last + 1} was expected"
                break
            records.append(frame.record)
            last = frame.seq
        if stop is None and scan.problem is not None:
            stop = scan.good_length, scan.problem
        if stop is not None:
            cut = Cut(path, *stop, dropped=[p for _, p in segments[i + 1 :]])
            return Replay(snapshot, snapshot_seq, records, last, covered, cut)
    return Replay(snapshot, snapshot_seq, records, last, covered)


def _read_snapshot(path: str) -> tuple[dict | None, int]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, 0
    except OSError as e:
        raise StateStoreError(f"cannot read the snapshot {path}: {e}") from e
    try:
        document = json.loads(data)
    except ValueError as e:
        raise StateStoreError(f"snapshot {path} is not valid JSON: {e}") from e
    if not isinstance(document, dict):
        raise StateStoreError(f"snapshot {path} is not a JSON object")
    if document.get("format") != SNAPSHOT_FORMAT:
        raise StateStoreError(
            f"snapshot {path} has format {document.get('format')!r}, "
            f"this version reads format {SNAPSHOT_FORMAT}"
        )
    seq, state = document.get("seq"), document.get("state")
    if type(seq) is not int or seq < 0 or not isinstance(state, dict):
        raise StateStoreError(
            f"snapshot {path} needs an integer seq >= 0 and a state object, "
            f"got seq {seq!r} and a state of type {type(state).__name__}"
        )
    return state, seq
