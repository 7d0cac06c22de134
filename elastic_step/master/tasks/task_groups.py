"""What the task manager's epochs and evaluation rounds are built from.

- :class:`Split`: a split's shards cut into tasks of ``records_per_task`` records, and the
  range of records of a task by its position;
- :class:`Group`: the tasks of one epoch or one round, with a done bit each and a hand-out
  pointer;
- :class:`Queue`: the order tasks are handed out in, taken-back ones first;
- :func:`pack` / :func:`unpack`: done bits as text for a snapshot.

Tested through the task manager, in tests/unit/test_task_manager.py.
"""

from __future__ import annotations

import base64
import bisect
from array import array
from collections import deque
from collections.abc import Callable, Sequence


class Split:
    """Shards cut into ranges of ``per_task`` records; the range of a task by its position."""

    def __init__(self, shards: Sequence[tuple[str, int]], per_task: int):
        self._per_task = per_task
        self._shards = [(uri, records) for uri, records in shards if records > 0]
        #: The position of each shard's first task, and of its first record in the split.
        self._first: list[int] = []
        self._first_record: list[int] = []
        count = records_before = 0
        for _, records in self._shards:
            self._first.append(count)
            self._first_record.append(records_before)
            count += -(-records // per_task)
            records_before += records
        self.count = count
        self.records = records_before

    def range_of(self, position: int) -> tuple[str, int, int]:
        index = bisect.bisect_right(self._first, position) - 1
        uri, records = self._shards[index]
        start = (position - self._first[index]) * self._per_task
        return uri, start, min(start + self._per_task, records)

    def first_index(self, position: int) -> int:
        """The position in the split of the first record of the task at ``position``."""
        index = bisect.bisect_right(self._first, position) - 1
        return self._first_record[index] + (position - self._first[index]) * self._per_task

    def records_of(self, position: int) -> int:
        _, start, end = self.range_of(position)
        return end - start


class Group:
    """The tasks of one epoch or one evaluation round: done bits and a hand-out pointer."""

    def __init__(self, base: int, size: int, order: array | None):
        #: The id of the task at position 0.
        self.base = base
        self.size = size
        #: Hand-out order of positions; None for position order.
        self.order = order
        #: Positions before this one were handed out (or skipped as done or held).
        self.pointer = 0
        self.done = bytearray((size + 7) // 8)
        self.done_count = 0

    def id_at(self, index: int) -> int:
        return self.base + (index if self.order is None else self.order[index])

    def is_done(self, position: int) -> bool:
        return bool(self.done[position >> 3] >> (position & 7) & 1)

    def mark_done(self, position: int) -> None:
        self.done[position >> 3] |= 1 << (position & 7)
        self.done_count += 1

    def load_done(self, done: bytes) -> None:
        self.done[:] = done
        self.done_count = int.from_bytes(done, "little").bit_count()

    @property
    def all_done(self) -> bool:
        return self.done_count == self.size


class Queue:
    """Task ids to hand out: those taken back first, then each group from its pointer on.

    Entries are not removed when a task is done or held elsewhere; ``todo`` skips them, and
    each entry is skipped once, so handing out is O(1) amortized."""

    def __init__(self) -> None:
        self.requeued: deque[int] = deque()
        #: Groups whose pointer may not be at the end, oldest first.
        self.groups: deque[Group] = deque()

    def peek(self, todo: Callable[[int], bool]) -> int | None:
        while self.requeued:
            if todo(self.requeued[0]):
                return self.requeued[0]
            self.requeued.popleft()
        while self.groups:
            group = self.groups[0]
            while group.pointer < group.size:
                task_id = group.id_at(group.pointer)
                if todo(task_id):
                    return task_id
                group.pointer += 1
            self.groups.popleft()
        return None

    def pop(self, todo: Callable[[int], bool]) -> int | None:
        task_id = self.peek(todo)
        if task_id is not None:
            if self.requeued:
                self.requeued.popleft()
            else:
                self.groups[0].pointer += 1
        return task_id


def pack(bits: bytearray) -> str:
    return base64.b64encode(bits).decode("ascii")


def unpack(text: str) -> bytes:
    return base64.b64decode(text)
