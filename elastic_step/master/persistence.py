"""How the master's state goes to its :class:`StateStore`: components' records and snapshots.

Three components change the state: the task manager (``tasks``), the instance manager
(``instances``) and the job record (``job``). Each emits small records for its changes;
this module tags them with the component, appends them to the store, and takes a snapshot
of all three every ``SNAPSHOT_EVERY`` records, so that a restart replays a short journal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_step.master.state_store import SavedState, StateStore

#: Records between snapshots. A snapshot of 100k tasks per epoch is about 50 KB; taking
#: one every few thousand records keeps replay short and the journal small.
SNAPSHOT_EVERY = 5000

COMPONENTS = ("job", "tasks", "instances")


class Journal:
    """Appends tagged records to the store; :meth:`maybe_snapshot` compacts now and then."""

    def __init__(self, store: StateStore, snapshot_every: int = SNAPSHOT_EVERY) -> None:
        self._store = store
        self._snapshot_every = snapshot_every
        self._since_snapshot = 0

    def writer(self, component: str) -> Callable[[dict], None]:
        """The callback through which ``component`` journals its records."""
        assert component in COMPONENTS, component

        def write(record: dict) -> None:
            self._store.append({"c": component, "r": record})
            self._since_snapshot += 1

        return write

    def snapshot(self, state: dict[str, dict]) -> None:
        """Snapshots ``state`` (one entry per component); call under the lock that orders the
        records, so that the snapshot covers exactly the records appended before it."""
        self._store.snapshot(state)
        self._since_snapshot = 0

    def due(self) -> bool:
        return self._since_snapshot >= self._snapshot_every


@dataclass
class Replay:
    """A saved state split by component: each one's snapshot part and its later records."""

    snapshot: dict[str, dict] | None
    records: dict[str, list[dict]] = field(default_factory=lambda: {c: [] for c in COMPONENTS})

    @classmethod
    def of(cls, saved: SavedState) -> Replay:
        replay = cls(saved.snapshot)
        for entry in saved.records:
            replay.records[entry["c"]].append(entry["r"])
        return replay

    def part(self, component: str) -> dict | None:
        return None if self.snapshot is None else self.snapshot[component]
