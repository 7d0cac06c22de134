"""The records of a task, in the order a worker trains or runs them.

- A task's ``[start, end)`` are records of its shard, read as one byte range
  (:func:`elastic_step.data.tfrecord.read_records`).
- A *permuted* training task's ``[start, end)`` are positions in the training split's
  permutation for the task's epoch (:func:`split_permutation`; master/tasks/task_size.py says
  when and why): the split is its shards joined in order, as the data directory's schema
  lists them for the master and every worker alike. The permutation is drawn from the job's
  seed and the epoch, so every worker draws the same one: an epoch's tasks hold each record
  once, and a retried task the same records. The worker reads the whole split for its first
  permuted task and keeps it (the master permutes only splits of at most 16,384 records and
  256 MB).
- A training task's records are then shuffled among themselves (:func:`shuffled`).

Tests: tests/unit/test_task_records.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from elastic_step.errors import InputError
from elastic_step.rpc import master_pb2


def split_permutation(seed: int, epoch: int, records: int) -> np.ndarray:
    """The order of a training split's ``records`` records in ``epoch`` for a job of
    ``seed``: the same on every worker, another one each epoch."""
    return np.random.default_rng([seed, epoch]).permutation(records)


def shuffled(records: list[bytes], seed: int, task: master_pb2.Task) -> list[bytes]:
    """A training task's records in an order of its own, drawn from the job's seed, the task
    and its epoch: the master shuffles the tasks of each epoch (or permutes the split), and
    this the records within each, so that every epoch's batches differ as with
    ``model.fit(shuffle=True)``. (The same order in every epoch cost a regression 9 % of
    validation MSE against fit, with one worker: bench/quality.py's diabetes.) A retried
    task gets the same order."""
    order = np.random.default_rng([seed, task.id, task.epoch]).permutation(len(records))
    return [records[i] for i in order]


class TaskRecords:
    """Reads tasks' records for a job of ``seed``. ``train_split`` gives the training split's
    ``(shard URI, records)`` in order; it is called, and the split read and kept, at the first
    permuted task. Safe from any thread."""

    def __init__(self, seed: int, train_split: Callable[[], Sequence[tuple[str, int]]]) -> None:
        self._seed = seed
        self._train_split = train_split
        self._lock = threading.Lock()
        self._split: list[bytes] | None = None

    def read(self, task: master_pb2.Task) -> list[bytes]:
        """The records of ``task`` (TRAIN, EVALUATE or PREDICT), a training task's shuffled.
        Raises :class:`InputError` for a shard that cannot be read or a range outside it."""
        from elastic_step.data.tfrecord import read_records  # pyarrow: 0.3 s, when needed

        if task.permuted:
            split = self._whole_split()
            if not 0 <= task.start <= task.end <= len(split):
                raise InputError(
                    f"permuted task {task.id}: positions [{task.start}, {task.end}) are outside "
                    f"the training split's [0, {len(split)})"
                )
            order = split_permutation(self._seed, task.epoch, len(split))
            records = [split[i] for i in order[task.start : task.end]]
        else:
            records = read_records(task.shard, task.start, task.end)
        if task.kind == master_pb2.Task.TRAIN:
            records = shuffled(records, self._seed, task)
        return records

    def _whole_split(self) -> list[bytes]:
        from elastic_step.data.tfrecord import read_records

        with self._lock:  # one read, by whichever thread asks first
            if self._split is None:
                self._split = [
                    record
                    for uri, records in self._train_split()
                    for record in read_records(uri, 0, records)
                ]
            return self._split
