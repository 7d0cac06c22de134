"""The writing half that every store built on a :class:`GroupCommitter` shares: records and
snapshots are queued to the committer, which the store creates when it acquires the lease."""

from __future__ import annotations

from elastic_step.master.state_store.api import StateStore, StateStoreError, StateStoreSettings
from elastic_step.master.state_store.group_commit import GroupCommitter


class CommittedStore(StateStore):
    """A store whose ``_committer`` (set by :meth:`acquire`) does the writing."""

    _committer: GroupCommitter | None
    _settings: StateStoreSettings

    def _owner(self) -> GroupCommitter:
        committer = self._committer
        if committer is None:
            raise StateStoreError(f"{self.describe()}: acquire the lease before writing")
        return committer

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
