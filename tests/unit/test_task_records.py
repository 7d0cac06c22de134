"""What a worker reads for a task (elastic_step/worker/task_records.py): a range task's
records, and a permuted training task's positions in its shard's permutation for the epoch,
from real TFRecord shards."""

from __future__ import annotations

import os

import pytest

from elastic_step.data.tfrecord import index_path, write_shard
from elastic_step.errors import InputError
from elastic_step.rpc import master_pb2
from elastic_step.worker.task_records import TaskRecords

RECORDS = [f"record-{i}".encode() for i in range(50)]
PER_TASK = 16
SEED = 7


@pytest.fixture
def shard(tmp_path) -> str:
    path = str(tmp_path / "train-00000.tfrecord")
    write_shard(path, RECORDS)
    return path


def task(shard: str, task_id: int, start: int, end: int, *, epoch: int = 1,
         kind=master_pb2.Task.TRAIN, permuted: bool = True) -> master_pb2.Task:  # fmt: skip
    return master_pb2.Task(kind=kind, id=task_id, shard=shard, start=start, end=end,
                           epoch=epoch, permuted=permuted)  # fmt: skip


def epoch_tasks(shard: str, epoch: int) -> list[master_pb2.Task]:
    """An epoch's permuted tasks of the shard, as the master cuts them (ids as its own)."""
    starts = range(0, len(RECORDS), PER_TASK)
    return [task(shard, (epoch - 1) * len(starts) + i, start, min(start + PER_TASK, len(RECORDS)),
                 epoch=epoch) for i, start in enumerate(starts)]  # fmt: skip


def test_an_epochs_permuted_tasks_hold_every_record_once_and_another_set_each_epoch(shard):
    reader = TaskRecords(SEED)
    epochs = {}
    for epoch in (1, 2, 3):
        tasks = [reader.read(t) for t in epoch_tasks(shard, epoch)]
        assert sorted(r for records in tasks for r in records) == sorted(RECORDS)
        assert [len(records) for records in tasks] == [16, 16, 16, 2]
        epochs[epoch] = [frozenset(records) for records in tasks]
    # A task is a set spread over the shard, not a range of it, and not the same set again.
    assert epochs[1][0] != frozenset(RECORDS[:PER_TASK])
    assert len({task_set for sets in epochs.values() for task_set in sets}) == 12


def test_a_permuted_task_read_again_or_by_another_worker_holds_the_same_records(shard):
    again = epoch_tasks(shard, 2)[1]
    first = TaskRecords(SEED).read(again)
    assert TaskRecords(SEED).read(again) == first  # another worker, the same order too
    assert set(TaskRecords(SEED + 1).read(again)) != set(first)  # another job's seed


def test_a_range_task_reads_its_range_and_only_training_shuffles_it(shard):
    reader = TaskRecords(SEED)
    trained = reader.read(task(shard, 3, 10, 26, permuted=False))
    assert trained != RECORDS[10:26] and sorted(trained) == sorted(RECORDS[10:26])
    evaluated = task(shard, 9, 10, 26, kind=master_pb2.Task.EVALUATE, permuted=False)
    assert reader.read(evaluated) == RECORDS[10:26]


def test_the_worker_keeps_a_permuted_tasks_shard_and_refuses_positions_past_its_end(shard):
    reader = TaskRecords(SEED)
    first = reader.read(epoch_tasks(shard, 1)[0])
    os.remove(shard)
    os.remove(index_path(shard))
    assert reader.read(epoch_tasks(shard, 1)[0]) == first  # kept: not read again
    with pytest.raises(InputError, match=r"permuted positions \[48, 60\) are outside \[0, 50\)"):
        reader.read(task(shard, 3, 48, 60))
    with pytest.raises(InputError, match=r"record index .* is missing"):
        TaskRecords(SEED).read(epoch_tasks(shard, 1)[0])  # a worker that never read it
