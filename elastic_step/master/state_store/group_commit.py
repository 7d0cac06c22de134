"""Group commit: callers queue records and snapshots in O(1); one thread writes them in batches.

Any store can use it: it calls the store's ``write(records, snapshot)`` with everything queued
since the last call, so the cost of making a batch durable (an fsync, an API request) is paid
once per batch, not per record. While one batch is written the next one gathers.
Tests: tests/contracts/state_store_contract.py (group commit), run by
tests/unit/test_state_store.py and tests/k8s/test_k8s_state_store.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from elastic_step.master.state_store.api import StateStoreError


@dataclass(frozen=True)
class PendingSnapshot:
    #: The seq of the last record the state reflects.
    seq: int
    state: dict


#: Writes ``(seq, record)`` pairs in order, then the snapshot if any; durable on return.
#: Raises StateStoreError (StateStoreFencedError once the lease is lost); nothing more is
#: written after a raise.
WriteFn = Callable[[list[tuple[int, dict]], PendingSnapshot | None], None]


class GroupCommitter:
    def __init__(self, name: str, write: WriteFn, next_seq: int) -> None:
        self._name = name
        self._write = write
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the writer waits here for work
        self._done = threading.Condition(self._lock)  # flush waits here for the writer
        self._pending: list[tuple[int, dict]] = []
        self._snapshot: PendingSnapshot | None = None
        self._next_seq = next_seq
        self._durable_seq = next_seq - 1
        self._snapshots_asked = 0
        self._snapshots_done = 0
        self.since_snapshot = 0
        self._writer_waiting = False
        self._stopping = False
        self._error: StateStoreError | None = None
        # A daemon: a master that exits without close() loses only what was not flushed.
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def append(self, record: dict) -> None:
        with self._lock:
            self._check()
            self._pending.append((self._next_seq, record))
            self._next_seq += 1
            self.since_snapshot += 1
            if self._writer_waiting:
                self._work.notify()

    def snapshot(self, state: dict) -> None:
        with self._lock:
            self._check()
            # Only the newest matters: it covers everything an older queued one covers.
            self._snapshot = PendingSnapshot(self._next_seq - 1, state)
            self._snapshots_asked += 1
            self.since_snapshot = 0
            if self._writer_waiting:
                self._work.notify()

    def flush(self, timeout_s: float) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        deadline = time.monotonic() + timeout_s
        with self._lock:
            seq, snapshots = self._next_seq - 1, self._snapshots_asked
            while self._error is None and (
                self._durable_seq < seq or self._snapshots_done < snapshots
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StateStoreError(
                        f"{self._name}: records up to {seq} not durable after {timeout_s:g} s "
                        f"(durable up to {self._durable_seq})"
                    )
                self._done.wait(left)
            self._raise_error()

    def stop(self, timeout_s: float) -> None:
        """Writes what is queued, then ends the writer thread."""
        with self._lock:
            self._stopping = True
            self._work.notify()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise StateStoreError(f"{self._name}: the writer did not stop in {timeout_s:g} s")

    def _check(self) -> None:
        self._raise_error()
        if self._stopping:
            raise StateStoreError(f"{self._name}: the store is closed")

    def _raise_error(self) -> None:
        if self._error is not None:
            # A new exception each time: re-raising one instance would pile up tracebacks.
            raise type(self._error)(str(self._error)) from self._error

    def _run(self) -> None:
        while True:
            with self._lock:
                while (
                    not self._pending
                    and self._snapshot is None
                    and not self._stopping
                    and self._error is None
                ):
                    self._writer_waiting = True
                    self._work.wait()
                    self._writer_waiting = False
                if self._error is not None or (not self._pending and self._snapshot is None):
                    return  # failed, or stopping with everything written
                records, self._pending = self._pending, []
                snapshot, self._snapshot = self._snapshot, None
                snapshots = self._snapshots_asked
            try:
                self._write(records, snapshot)
            except StateStoreError as e:
                self.fail(e)
                return
            except Exception as e:
                error = StateStoreError(f"{self._name}: the writer failed: {e!r}")
                error.__cause__ = e
                self.fail(error)
                return
            with self._lock:
                if records:
                    self._durable_seq = records[-1][0]
                if snapshot is not None:
                    self._snapshots_done = snapshots
                self._done.notify_all()

    def fail(self, error: StateStoreError) -> None:
        """From now on every call raises ``error`` (the first one given), and nothing more is
        written: the writer stops before its next batch."""
        with self._lock:
            self._error = self._error or error
            self._done.notify_all()
            self._work.notify()
