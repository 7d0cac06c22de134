"""The StateStore contract, as tests every state store must pass: ``file`` in ``make test``,
``kubernetes`` in ``make test-k8s``.

A store's test module subclasses :class:`StateStoreContract` (as ``Test...``) and provides a
``new_store`` fixture: a callable that makes a store of the test's job, which every store it
makes shares, as a restarted master's store shares its predecessor's.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import pytest

from elastic_step.master.state_store import SavedState, StateStore, StateStoreError

STATE = {
    "tasks": {"train_todo": [{"id": 3, "shard": "a", "start": 0, "end": 4}], "done": [1, 2]},
    "model_version": 17,
    "phase": "running",
    "metrics": [{"accuracy": 0.75, "loss": None}],
}

NewStore = Callable[[], StateStore]


def record(i: int) -> dict:
    return {"op": "task_done", "task": i, "worker": f"worker-{i % 3}"}


class StateStoreContract(ABC):
    """The semantics of :class:`elastic_step.master.state_store.StateStore` that the master
    relies on: what is appended and snapshotted loads back, in order; one owner at a time,
    each with a greater token; a failed writer takes nothing after the failure."""

    #: The most any wait below may take (a store on a cluster waits on its API server).
    wait_s: float = 10.0
    #: How many records the group commit test appends, and the most durable writes each may
    #: take on average.
    group_commit_records: int = 20_000
    writes_per_record: float = 1 / 100

    @abstractmethod
    def count_writes(self, store: StateStore, monkeypatch: pytest.MonkeyPatch) -> list:
        """A list that gains an item for every durable write ``store`` makes from now on (an
        fsync, a request to the API server)."""

    def owner(self, new_store: NewStore, name: str = "master") -> StateStore:
        store = new_store()
        store.acquire(name, timeout_s=self.wait_s)
        return store

    def test_appended_records_load_in_order_in_a_new_store(self, new_store: NewStore) -> None:
        assert new_store().load() == SavedState(None, [])
        store = self.owner(new_store)
        assert store.load() == SavedState(None, [])
        for i in range(50):
            store.append(record(i))
        store.flush(self.wait_s)
        # A reader needs no lease, even while the owner holds it.
        assert new_store().load() == SavedState(None, [record(i) for i in range(50)])
        store.close()
        assert new_store().load() == SavedState(None, [record(i) for i in range(50)])

    def test_a_snapshot_and_the_records_after_it_load_together_and_a_new_owner_continues(
        self, new_store: NewStore
    ) -> None:
        store = self.owner(new_store, "first")
        store.append(record(1))
        store.snapshot(STATE)
        store.append(record(2))
        store.append(record(3))
        store.close()
        assert new_store().load() == SavedState(STATE, [record(2), record(3)])

        store = self.owner(new_store, "second")
        assert store.load() == SavedState(STATE, [record(2), record(3)])
        store.append(record(4))
        store.close()
        assert new_store().load() == SavedState(STATE, [record(2), record(3), record(4)])

    def test_flush_waits_for_a_snapshot_too(self, new_store: NewStore) -> None:
        store = self.owner(new_store)
        store.append(record(1))
        store.snapshot(STATE)
        store.flush(self.wait_s)
        assert new_store().load() == SavedState(STATE, [])
        store.close()

    def test_a_record_that_is_not_json_ready_fails_the_writer_after_the_records_before_it(
        self, new_store: NewStore
    ) -> None:
        store = self.owner(new_store)
        store.append(record(1))
        store.append({"bad": {1, 2}})
        with pytest.raises(StateStoreError, match=r"record 2 is not JSON-ready: .*set"):
            store.flush(self.wait_s)
        with pytest.raises(StateStoreError, match="record 2 is not JSON-ready"):
            store.append(record(3))
        with pytest.raises(StateStoreError):
            store.close()
        assert new_store().load() == SavedState(None, [record(1)])

    def test_a_reader_loading_while_the_owner_compacts_always_sees_a_consistent_state(
        self, new_store: NewStore
    ) -> None:
        store = self.owner(new_store)
        store.snapshot({"upto": -1})
        store.flush(self.wait_s)
        stop = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            try:
                i = 0
                while not stop.is_set() and i < 100_000:
                    store.append({"i": i})
                    if i % 10 == 9:
                        store.snapshot({"upto": i})
                        store.flush(self.wait_s)  # let the reader meet many compactions
                    i += 1
            except BaseException as e:
                errors.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        reader = new_store()
        loads = 0
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and loads < 300:
                loaded = reader.load()
                start = loaded.snapshot["upto"] + 1
                assert loaded.records == [{"i": start + k} for k in range(len(loaded.records))]
                loads += 1
        finally:
            stop.set()
            writer.join(self.wait_s)
            store.close()
        assert not errors
        assert loads > 0

    def test_group_commit_makes_many_records_durable_with_few_writes(
        self, new_store: NewStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = self.owner(new_store)
        writes = self.count_writes(store, monkeypatch)
        count = self.group_commit_records
        records = [record(i) for i in range(count)]
        started = time.perf_counter()
        for r in records:
            store.append(r)
        appending_s = time.perf_counter() - started
        store.flush(self.wait_s)
        flushed_s = time.perf_counter() - started

        assert len(writes) < count * self.writes_per_record
        assert appending_s < 1.0  # appends only queue
        print(f"\n{count} records: {len(writes)} writes, durable in {flushed_s:.2f} s")
        assert new_store().load() == SavedState(None, records)
        store.close()

    def test_tokens_grow_with_every_owner(self, new_store: NewStore) -> None:
        tokens = []
        for _ in range(3):
            store = new_store()
            tokens.append(store.acquire("master", timeout_s=self.wait_s))
            store.close()
        assert tokens == [1, 2, 3]

    def test_nothing_can_be_written_before_acquire(self, new_store: NewStore) -> None:
        store = new_store()
        with pytest.raises(StateStoreError, match="acquire the lease before writing"):
            store.append(record(1))
        with pytest.raises(StateStoreError, match="acquire the lease before writing"):
            store.snapshot(STATE)
        store.close()  # nothing to close

    def test_a_closed_store_refuses_writes_and_is_acquired_at_most_once(
        self, new_store: NewStore
    ) -> None:
        store = self.owner(new_store)
        store.close()
        store.close()
        with pytest.raises(StateStoreError, match="closed"):
            store.append(record(1))
        with pytest.raises(StateStoreError, match="at most once"):
            store.acquire("master", timeout_s=0)
