"""The records of a task, in the order a worker trains or runs them.

- A task's ``[start, end)`` are records of its shard, read as one byte range
  (:func:`elastic_step.data.tfrecord.read_records`).
- A *permuted* training task's ``[start, end)`` are positions in its shard's permutation for
  the task's epoch (:func:`shard_permutation`; master/tasks/task_size.py says when and why).
  The permutation is drawn from the job's seed, the epoch and the shard's URI, so every worker
  draws the same one: an epoch's tasks hold each record of the shard once, and a retried task
  the same records. The worker reads the whole shard the first time and keeps it (the master
  permutes only splits of at most 16,384 records), up to :data:`KEPT_SHARD_BYTES` in all.
- A training task's records are then shuffled among themselves (:func:`shuffled`).

Tests: tests/unit/test_task_records.py.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict

import numpy as np

from elastic_step.errors import InputError
from elastic_step.rpc import master_pb2

#: The most bytes of whole shards a worker keeps for permuted tasks; the oldest read goes
#: first, and a shard larger than this alone is read again for each task.
KEPT_SHARD_BYTES = 256 << 20


def shard_permutation(seed: int, epoch: int, shard: str, records: int) -> np.ndarray:
    """The order of ``shard``'s ``records`` records in ``epoch`` for a job of ``seed``: the
    same on every worker, another one each epoch."""
    return np.random.default_rng([seed, epoch, zlib.crc32(shard.encode())]).permutation(records)


def shuffled(records: list[bytes], seed: int, task: master_pb2.Task) -> list[bytes]:
    """A training task's records in an order of its own, drawn from the job's seed, the task
    and its epoch: the master shuffles the tasks of each epoch, and this the records within
    each, so that every epoch's batches differ as with ``model.fit(shuffle=True)``. (The same
    order in every epoch cost a regression 9 % of validation MSE against fit, with one
    worker: bench/quality.py's diabetes.) A retried task gets the same order."""
    order = np.random.default_rng([seed, task.id, task.epoch]).permutation(len(records))
    return [records[i] for i in order]


class TaskRecords:
    """Reads tasks' records for a job of ``seed``; keeps whole shards for permuted tasks.
    Safe from any thread."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, list[bytes]] = OrderedDict()
        self._kept_bytes = 0

    def read(self, task: master_pb2.Task) -> list[bytes]:
        """The records of ``task`` (TRAIN, EVALUATE or PREDICT), a training task's shuffled.
        Raises :class:`InputError` for a shard that cannot be read or a range outside it."""
        from elastic_step.data.tfrecord import read_records  # pyarrow: 0.3 s, when needed

        if task.permuted:
            shard = self._whole(task.shard)
            if not 0 <= task.start <= task.end <= len(shard):
                raise InputError(
                    f"{task.shard}: permuted positions [{task.start}, {task.end}) are outside "
                    f"[0, {len(shard)})"
                )
            order = shard_permutation(self._seed, task.epoch, task.shard, len(shard))
            records = [shard[i] for i in order[task.start : task.end]]
        else:
            records = read_records(task.shard, task.start, task.end)
        if task.kind == master_pb2.Task.TRAIN:
            records = shuffled(records, self._seed, task)
        return records

    def _whole(self, shard: str) -> list[bytes]:
        from elastic_step.data.tfrecord import count_records, read_records

        with self._lock:
            if shard in self._kept:
                self._kept.move_to_end(shard)
                return self._kept[shard]
        records = read_records(shard, 0, count_records(shard))
        size = sum(map(len, records))
        if size <= KEPT_SHARD_BYTES:
            with self._lock:
                if shard not in self._kept:
                    self._kept[shard] = records
                    self._kept_bytes += size
                while self._kept_bytes > KEPT_SHARD_BYTES:
                    _, dropped = self._kept.popitem(last=False)
                    self._kept_bytes -= sum(map(len, dropped))
        return records
