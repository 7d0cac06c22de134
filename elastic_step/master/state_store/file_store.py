"""A state store in a local directory.

Layout::

    lock                        flock held by the owner; names it, for the next contender
    token                       the last fencing token given out
    snapshot.json               {"format": 2, "seq": S, "token": T, "state": {...}}
    journal-<first seq>.log     framed records (see journal.py)
    secret                      the job's secret (the directory and its files are 0700/0600)

Writing a snapshot covering records up to S: the records up to S are made durable, a new
segment ``journal-<S+1>.log`` takes the records after S, the snapshot replaces the old one
(temp file, fsync, rename, fsync of the directory), then the older segments are deleted. A
crash at any point loads correctly (see replay.py).
Tests: tests/unit/test_state_store.py.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from elastic_step.data.storage import SET_ASIDE_DIR
from elastic_step.master.state_store.api import (
    SavedState,
    StateStoreError,
    StateStoreSettings,
)
from elastic_step.master.state_store.committed_store import CommittedStore
from elastic_step.master.state_store.file_lease import FileLease
from elastic_step.master.state_store.group_commit import GroupCommitter, PendingSnapshot
from elastic_step.master.state_store.journal import SegmentWriter, encode_json, list_segments
from elastic_step.master.state_store.local_files import (
    fsync_dir,
    local_dir,
    remove_temporaries,
    write_atomic,
)
from elastic_step.master.state_store.replay import (
    SNAPSHOT_FILE,
    SNAPSHOT_FORMAT,
    Cut,
    Replay,
    read_directory,
)

log = logging.getLogger("elastic_step.master.state_store")

SECRET_FILE = "secret"


class FileStateStore(CommittedStore):
    def __init__(self, directory: str, settings: StateStoreSettings | None = None) -> None:
        self._dir = local_dir(directory)
        self._settings = settings or StateStoreSettings()
        self._lease = FileLease(self._dir)
        self._mutex = threading.Lock()  # acquire and close against each other
        self._committer: GroupCommitter | None = None
        self._segment: SegmentWriter | None = None
        self._closed = False

    # -- the lease and recovery --

    def acquire(self, owner: str, timeout_s: float) -> int:
        with self._mutex:
            if self._committer is not None or self._closed:
                raise StateStoreError(f"{self._dir}: a store is acquired at most once")
            try:
                os.makedirs(self._dir, mode=0o700, exist_ok=True)
                os.chmod(self._dir, 0o700)  # it holds the job's secret
            except OSError as e:
                raise StateStoreError(f"cannot create the state directory: {e}") from e
            token = self._lease.acquire(owner, timeout_s)
            try:
                next_seq = self._recover()
            except OSError as e:
                self._lease.release()
                raise StateStoreError(f"cannot recover the state in {self._dir}: {e}") from e
            except BaseException:
                self._lease.release()
                raise
            self._committer = GroupCommitter(f"state store {self._dir}", self._write, next_seq)
            return token

    def _recover(self) -> int:
        """Repairs what a crashed owner left; returns the next record's seq."""
        replay = read_directory(self._dir)
        remove_temporaries(self._dir)
        if replay.cut is not None:
            self._cut(replay)
        for path in replay.covered:  # a crash came between a snapshot and their deletion
            os.remove(path)
        if replay.covered or (replay.cut is not None and replay.cut.dropped):
            fsync_dir(self._dir)
        segments = list_segments(self._dir)
        next_seq = replay.last_seq + 1
        self._segment = SegmentWriter(self._dir, segments[-1][0] if segments else next_seq)
        return next_seq

    def _cut(self, replay: Replay) -> None:
        """Ends the journal at the cut. A torn last record is an ordinary crash, and goes;
        past any other damage, what follows is set aside (``set-aside/``), never deleted."""
        cut = replay.cut
        ordinary = not cut.dropped and "torn" in cut.problem
        aside = "" if ordinary else f"; set aside {self._set_aside_past(cut)}"
        with open(cut.path, "r+b") as f:
            f.truncate(cut.offset)
            os.fsync(f.fileno())
        log.log(
            logging.INFO if ordinary else logging.WARNING,
            "%s: the journal ended in %s at byte %d; truncated it there%s. "
            "The state resumes after record %d",
            cut.path,
            cut.problem,
            cut.offset,
            aside,
            replay.last_seq,
        )

    def _set_aside_past(self, cut: Cut) -> str:
        """Moves what lies past the cut into ``set-aside/``: the rest of its segment, and
        the later segments; says where it went."""
        aside = os.path.join(self._dir, SET_ASIDE_DIR)
        os.makedirs(aside, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        with open(cut.path, "rb") as f:
            f.seek(cut.offset)
            rest = f.read()
        name = f"{stamp}-{os.path.basename(cut.path)}.from-byte-{cut.offset}"
        write_atomic(os.path.join(aside, name), rest)
        for path in cut.dropped:
            os.replace(path, os.path.join(aside, f"{stamp}-{os.path.basename(path)}"))
        fsync_dir(aside)
        later = f" and {len(cut.dropped)} later segment(s)" if cut.dropped else ""
        return f"its {len(rest)} bytes from there{later} in {aside}"

    # -- reading --

    def load(self) -> SavedState:
        if not os.path.isdir(self._dir):
            return SavedState(None, [])
        try:
            replay = read_directory(self._dir)
        except OSError as e:
            raise StateStoreError(f"cannot read the state in {self._dir}: {e}") from e
        return replay.saved()

    # -- writing --

    def _write(self, records: list[tuple[int, dict]], snapshot: PendingSnapshot | None) -> None:
        """The writer thread's batch: records in order, then the snapshot and compaction."""
        try:
            self._lease.check()
            if snapshot is None:
                self._segment.write(records)
                return
            split = next((i for i, (seq, _) in enumerate(records) if seq > snapshot.seq), None)
            split = len(records) if split is None else split
            self._segment.write(records[:split])
            if self._segment.first_seq != snapshot.seq + 1:
                segment = SegmentWriter(self._dir, snapshot.seq + 1)
                self._segment.close()
                self._segment = segment
            self._segment.write(records[split:])
            self._write_snapshot(snapshot)
            for first_seq, path in list_segments(self._dir):
                if first_seq < self._segment.first_seq:
                    os.remove(path)  # no fsync: if they come back, replay skips them
        except OSError as e:
            raise StateStoreError(f"cannot write the state in {self._dir}: {e}") from e

    def _write_snapshot(self, snapshot: PendingSnapshot) -> None:
        document = {
            "format": SNAPSHOT_FORMAT,
            "seq": snapshot.seq,
            "token": self._lease.token,
            "state": snapshot.state,
        }
        try:
            data = encode_json(document)
        except (TypeError, ValueError) as e:
            raise StateStoreError(
                f"the snapshot after record {snapshot.seq} is not JSON-ready: {e}"
            ) from e
        self._lease.check()  # again: the snapshot replaces what a successor may rely on
        write_atomic(os.path.join(self._dir, SNAPSHOT_FILE), data)

    # -- the end --

    def _after_writer_stopped(self) -> None:
        self._segment.close()

    def job_secret(self) -> str:
        path = os.path.join(self._dir, SECRET_FILE)
        try:
            with open(path) as f:
                return f.read().strip()
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StateStoreError(f"cannot read the job's secret {path}: {e}") from e
        secret = secrets.token_hex(32)
        try:
            write_atomic(path, secret.encode())
        except OSError as e:
            raise StateStoreError(f"cannot save the job's secret {path}: {e}") from e
        return secret

    def describe(self) -> str:
        return self._dir
