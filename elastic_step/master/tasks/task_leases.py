"""The leases of the tasks a task manager handed out: who holds which task, under which id,
and until when.

A lease runs out ``timeout_s`` after it was handed out or last renewed (its batch count, or
that of another lease of its worker, went up). Ids are unique for the life of the job:
``next_id`` only goes up. Leases are kept in the order their deadlines were set, so those
that ran out are the oldest ones; the clock must be monotonic. Deadlines are not durable:
:meth:`Leases.refresh` gives every lease a full ``timeout_s`` after a restore.

Tested through the task manager, in tests/unit/test_task_manager.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class Lease:
    worker: str
    lease_id: int
    #: The highest batch count the worker reported under this lease.
    batches: int
    deadline: float
    #: The job's model version when the task was handed out: its worker pushes after that,
    #: so its report carries this version or a later one. Not durable (0 after a restore).
    version: int = 0


class Leases:
    """Leases by task id, oldest deadline first, found also by lease id and by worker."""

    def __init__(self, *, next_id: int, timeout_s: float, clock: Callable[[], float]):
        self._clock = clock
        self._timeout_s = timeout_s
        self._by_task: OrderedDict[int, Lease] = OrderedDict()
        self._tasks: dict[int, int] = {}
        #: Task ids each worker holds, in hand-out order.
        self._held: dict[str, dict[int, None]] = {}
        #: The id of the next lease handed out.
        self.next_id = next_id

    def __contains__(self, task_id: int) -> bool:
        return task_id in self._by_task

    def __getitem__(self, task_id: int) -> Lease:
        return self._by_task[task_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_task)

    def __len__(self) -> int:
        return len(self._by_task)

    def task_of(self, lease_id: int) -> int | None:
        return self._tasks.get(lease_id)

    def held_by(self, worker: str) -> list[int]:
        """The task ids ``worker`` holds, in hand-out order (by lease id: a restore adds them
        in another)."""
        return sorted(self._held.get(worker, ()), key=lambda t: self._by_task[t].lease_id)

    def holds(self, task_id: int, worker: str, lease_id: int) -> bool:
        lease = self._by_task.get(task_id)
        return lease is not None and lease.worker == worker and lease.lease_id == lease_id

    def add(self, task_id: int, worker: str, lease_id: int, batches: int, version: int = 0) -> None:
        deadline = self._clock() + self._timeout_s
        self._by_task[task_id] = Lease(worker, lease_id, batches, deadline, version)
        self._tasks[lease_id] = task_id
        self._held.setdefault(worker, {})[task_id] = None
        self.next_id = max(self.next_id, lease_id + 1)

    def drop(self, task_id: int) -> Lease:
        lease = self._by_task.pop(task_id)
        del self._tasks[lease.lease_id]
        held = self._held[lease.worker]
        del held[task_id]
        if not held:
            del self._held[lease.worker]
        return lease

    def renew(self, task_id: int, batches: int) -> None:
        """Notes progress: the lease runs out ``timeout_s`` from now, and so does every other
        lease its worker holds (a task it prefetched waits on the one in hand)."""
        lease = self._by_task[task_id]
        lease.batches = batches
        deadline = self._clock() + self._timeout_s
        for held in self._held[lease.worker]:
            self._by_task[held].deadline = deadline
            self._by_task.move_to_end(held)

    def expired(self) -> list[tuple[int, str]]:
        """The tasks whose lease ran out, oldest first, with their worker (still held)."""
        now = self._clock()
        expired = []
        for task_id, lease in self._by_task.items():
            if lease.deadline >= now:
                break
            expired.append((task_id, lease.worker))
        return expired

    def lowest_version(self, counted: Callable[[int], bool]) -> int | None:
        """The lowest :attr:`Lease.version` of the leases of the tasks ``counted``; None when
        none is out."""
        return min(
            (lease.version for t, lease in self._by_task.items() if counted(t)), default=None
        )

    def refresh(self) -> None:
        """Gives every lease a full ``timeout_s`` from now."""
        deadline = self._clock() + self._timeout_s
        for lease in self._by_task.values():
            lease.deadline = deadline

    def to_json(self) -> list[list]:
        return [
            [t, lease.worker, lease.lease_id, lease.batches]
            for t, lease in sorted(self._by_task.items())
        ]

    def load(self, entries: list[list]) -> None:
        """Adds the leases of :meth:`to_json`, each with a full ``timeout_s``."""
        for task_id, worker, lease_id, batches in entries:
            self.add(task_id, worker, lease_id, batches)
