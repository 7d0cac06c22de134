"""Where the master keeps the state it needs to resume a job after a restart.

The state is a journal: a *snapshot* (one JSON-ready dict: the task queues, epoch, model
version, worker registry, metrics so far) plus small *records* (JSON-ready dicts, one per
change) appended after it. Replaying the records in order onto the snapshot gives the state.

One *owner* (the master) writes, after taking the job's lease with :meth:`StateStore.acquire`;
the lease's fencing token stops an owner that lost it from writing over its successor. Writes
are asynchronous: :meth:`StateStore.append` and :meth:`StateStore.snapshot` only queue, and a
background writer makes batches of them durable at once (group commit). A snapshot lets the
store drop the records it covers (compaction).

A load after a crash returns a prefix of what was appended, never a mix: the newest durable
snapshot and every durable record after it, in order, up to the first record torn by the crash.
Tests: tests/contracts/state_store_contract.py, run for each store by
tests/unit/test_state_store.py and tests/k8s/test_k8s_state_store.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from elastic_step.errors import ElasticStepError


class StateStoreError(ElasticStepError):
    """The state could not be saved or read back (the message names where and why)."""


class StateStoreLockedError(StateStoreError):
    """Another owner holds the job's lease (the message names it)."""


class StateStoreFencedError(StateStoreError):
    """This owner lost the job's lease to a newer one: it must stop writing."""


@dataclass(frozen=True)
class SavedState:
    #: The newest durable snapshot; None when none was ever taken.
    snapshot: dict | None
    #: Every durable record appended after that snapshot, in order.
    records: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Replayed:
    """What a store reads back before it writes (each store's Replay adds where its
    journal was cut): the snapshot, its seq, and the records after it in order."""

    snapshot: dict | None
    snapshot_seq: int
    records: list[dict]
    #: The last record's seq, or the snapshot's when no record follows it.
    last_seq: int

    def saved(self) -> SavedState:
        return SavedState(self.snapshot, self.records)


@dataclass(frozen=True)
class StateStoreSettings:
    """Tunables every store accepts; the defaults suit the master."""

    #: :meth:`StateStore.snapshot_due` turns True after this many records since the last
    #: snapshot, which bounds both the journal's size and the replay after a restart.
    snapshot_every_records: int = 10_000
    #: How long :meth:`StateStore.close` waits for pending writes.
    close_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.snapshot_every_records < 1:
            raise ValueError(
                f"snapshot_every_records must be at least 1, got {self.snapshot_every_records}"
            )
        if not self.close_timeout_s >= 0:
            raise ValueError(f"close_timeout_s must be >= 0, got {self.close_timeout_s}")


class StateStore(ABC):
    """The master's durable state: a lease, a snapshot and a journal of records.

    The owner's sequence: :meth:`acquire`, :meth:`load`, then :meth:`append` and
    :meth:`snapshot` from any thread, and :meth:`close` at the end. A reader that only looks
    (``elastic-step status``, tests) calls :meth:`load` alone. Implementations are thread-safe.
    """

    @abstractmethod
    def acquire(self, owner: str, timeout_s: float) -> int:
        """Takes the job's lease for ``owner`` and returns its fencing token.

        The token is strictly larger than any token given before for this job. While another
        live owner holds the lease, waits up to ``timeout_s`` for it to be released or run out,
        then raises :class:`StateStoreLockedError` naming the holder. The lease is held until
        :meth:`close`, or until the owner dies. Acquiring also repairs what a crashed owner
        left (a torn last record), so :meth:`load` right after it returns what this owner
        builds on. Nothing can be written before acquire; a store is acquired at most once.
        """

    @abstractmethod
    def load(self) -> SavedState:
        """The durable state: the newest snapshot and every record after it, in order.

        Needs no lease: a reader may load while an owner writes and gets a consistent prefix.
        Records still queued in this store are not included; the owner loads right after
        :meth:`acquire`, before its first append.
        """

    @abstractmethod
    def append(self, record: dict) -> None:
        """Queues ``record`` to be written after everything appended before it.

        O(1): never blocks on I/O, so the master calls it under its own lock. The store takes
        ``record`` as it is: the caller must not change it (or anything in it) afterwards. A
        background writer writes queued records in batches and makes each batch durable at
        once (group commit); :meth:`flush` waits for that.

        Raises :class:`StateStoreFencedError` once the store knows the lease is lost, and
        :class:`StateStoreError` once the writer failed (the error names why) or the store is
        closed. A record that is not JSON-ready fails the writer.
        """

    @abstractmethod
    def snapshot(self, state: dict) -> None:
        """Queues ``state`` as the new snapshot.

        ``state`` must reflect every record appended before this call (the caller calls it
        under the same lock as :meth:`append`), and the store takes it as it is: the caller
        builds it fresh and never changes it afterwards. O(1) for the caller: it is written in
        the background, after the records before it; once it is durable the records it covers
        are dropped (compaction). Raises as :meth:`append` does.
        """

    @abstractmethod
    def snapshot_due(self) -> bool:
        """Whether enough records were appended since the last snapshot that the owner should
        take one now (see :attr:`StateStoreSettings.snapshot_every_records`)."""

    @abstractmethod
    def flush(self, timeout_s: float) -> None:
        """Blocks until everything appended and snapshotted before the call is durable.

        Also confirms the lease, even with nothing to write: raises
        :class:`StateStoreFencedError` if it was lost,
        :class:`StateStoreError` if the writer failed or ``timeout_s`` ran out.
        """

    @abstractmethod
    def close(self) -> None:
        """Flushes (waiting up to the settings' ``close_timeout_s``), stops the writer and
        releases the lease, then raises what the flush raised, if anything.

        Only a writer stuck in I/O past the timeout keeps the lease (until the process ends),
        so that no successor starts while this owner may still write. Idempotent; a store
        that was never acquired has nothing to close.
        """

    @abstractmethod
    def job_secret(self) -> str:
        """The job's secret, made at the first call and the same at every later one, by any
        owner. Kept apart from the snapshot and the journal (which status readers load),
        where only the job's master can read it. Call after :meth:`acquire`."""

    @property
    def takeover_wait_s(self) -> float:
        """How long a new owner should wait in :meth:`acquire` for a crashed owner's lease to
        run out."""
        return 5.0

    @abstractmethod
    def describe(self) -> str:
        """Where the state lives, for logs and messages."""
