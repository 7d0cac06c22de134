"""The writing half that every store built on a :class:`GroupCommitter` shares: records and
snapshots are queued to the committer, which the store creates when it acquires the lease.
Tests: tests/unit/test_state_store.py; against an API server, tests/k8s/test_k8s_state_store.py."""

from __future__ import annotations

import threading
from typing import Any

from elastic_step.master.state_store.api import StateStore, StateStoreError, StateStoreSettings
from elastic_step.master.state_store.group_commit import GroupCommitter


class CommittedStore(StateStore):
    """A store whose ``_committer`` (set by :meth:`acquire`) does the writing."""

    _committer: GroupCommitter | None
    _settings: StateStoreSettings
    _mutex: threading.Lock
    _closed: bool
    _lease: Any  # the store's lease: check() raises when it is lost, release() gives it up
    #: What a failed check of the lease raises that ends the writer: the lease is lost.
    _lease_lost: type[StateStoreError] = StateStoreError

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            committer = self._committer
            if committer is None:
                return
            try:
                committer.flush(self._settings.close_timeout_s)
            finally:
                # A writer stuck in I/O keeps the lease (until the process ends): no
                # successor starts while this owner may still write.
                committer.stop(self._settings.close_timeout_s)
                self._after_writer_stopped()
                self._lease.release()

    def _after_writer_stopped(self) -> None:
        """Releases what the writer held, before the lease goes; nothing by default."""

    def _owner(self) -> GroupCommitter:
        committer = self._committer
        if committer is None:
            raise StateStoreError(f"{self.describe()}: acquire the lease before writing")
        return committer

    def flush(self, timeout_s: float) -> None:
        committer = self._owner()
        committer.flush(timeout_s)
        try:
            self._lease.check()  # also when there was nothing to write
        except self._lease_lost as e:
            committer.fail(e)
            raise

    def append(self, record: dict) -> None:
        if not isinstance(record, dict):
            raise TypeError(f"a record must be a dict, got {type(record).__name__}")
        self._owner().append(record)

    def snapshot(self, state: dict) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"a snapshot's state must be a dict, got {type(state).__name__}")
        self._owner().snapshot(state)

    def snapshot_due(self) -> bool:
        committer = self._committer
        return committer is not None and (
            committer.since_snapshot >= self._settings.snapshot_every_records
        )
