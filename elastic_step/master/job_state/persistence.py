"""How the master's state goes to its :class:`StateStore`: components' records and snapshots.

Three components change the state: the task manager (``tasks``), the instance manager
(``instances``) and the job record (``job``). Each emits small records for its changes;
this module tags them with the component and appends them to the store; a snapshot of all
three, when the store says one is due, keeps the journal that a restart replays short.
Tests: tests/unit/test_coordinator.py (test_a_restarted_master_resumes_from_the_journal).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_step.errors import InputError
from elastic_step.master.state_store import (
    SavedState,
    StateStore,
    StateStoreError,
)

log = logging.getLogger("elastic_step.master")

#: Seconds to wait for what the store has been given to be durable.
FLUSH_TIMEOUT_S = 30.0
COMPONENTS = ("job", "tasks", "instances")


class Recorder:
    """Appends tagged records to the store, and snapshots the whole state when asked."""

    def __init__(self, store: StateStore) -> None:
        self._store = store

    def writer(self, component: str) -> Callable[[dict], None]:
        """The callback through which ``component`` journals its records."""
        assert component in COMPONENTS, component

        def write(record: dict) -> None:
            self._store.append({"c": component, "r": record})

        return write

    def snapshot(self, state: dict[str, dict]) -> None:
        """Snapshots ``state`` (one entry per component); call under the lock that orders the
        records, so that the snapshot covers exactly the records appended before it."""
        self._store.snapshot(state)

    def due(self) -> bool:
        return self._store.snapshot_due()


@dataclass
class SavedJob:
    """A saved state split by component: each one's snapshot part and its later records."""

    snapshot: dict[str, dict] | None
    records: dict[str, list[dict]] = field(default_factory=lambda: {c: [] for c in COMPONENTS})

    @classmethod
    def of(cls, saved: SavedState) -> SavedJob:
        """Raises InputError for a journal record that is not a component's record."""
        job = cls(saved.snapshot)
        for n, entry in enumerate(saved.records):
            try:
                job.records[entry["c"]].append(entry["r"])
            except (KeyError, TypeError) as e:
                raise InputError(
                    f"the job's saved state is damaged: journal record {n + 1} after the "
                    f"snapshot is not a record of {', '.join(COMPONENTS)} ({type(e).__name__}: "
                    f"{e}); move the state aside to start the job anew"
                ) from None
        return job

    def part(self, component: str) -> dict | None:
        return None if self.snapshot is None else self.snapshot[component]


def close_store(store: StateStore, *, quietly: bool) -> None:
    """Closes ``store``; ``quietly``: a failure is logged, not raised (another error is the
    one to report, or the run was deleted with its state)."""
    try:
        store.close()
    except StateStoreError as e:
        if not quietly:
            raise
        log.warning("closing the state store failed: %s", e)
