"""What a worker reads for a task (elastic_step/worker/task_records.py): a range task's
records, and a permuted training task's positions in the training split's permutation for
the epoch, from real TFRecord shards; and the order it trains a task's records in
(``shuffled``): drawn from the job's seed, the task and its epoch, as fit shuffles each
epoch."""

from __future__ import annotations

import os

import pytest

from elastic_step.data.tfrecord import index_path, write_shard
from elastic_step.errors import InputError
from elastic_step.rpc import master_pb2
from elastic_step.worker.task_records import TaskRecords, shuffled

# Two shards, as the master joins them: 30 and 20 records.
RECORDS = [f"record-{i}".encode() for i in range(50)]
PER_TASK = 16
SEED = 7


@pytest.fixture
def split(tmp_path) -> list[tuple[str, int]]:
    shards = []
    for name, part in (("train-00000", RECORDS[:30]), ("train-00001", RECORDS[30:])):
        path = str(tmp_path / f"{name}.tfrecord")
        write_shard(path, part)
        shards.append((path, len(part)))
    return shards


def task(task_id: int, start: int, end: int, *, epoch: int = 1, shard: str = "",
         kind=master_pb2.Task.TRAIN, permuted: bool = True) -> master_pb2.Task:  # fmt: skip
    return master_pb2.Task(kind=kind, id=task_id, shard=shard, start=start, end=end,
                           epoch=epoch, permuted=permuted)  # fmt: skip


def epoch_tasks(epoch: int) -> list[master_pb2.Task]:
    """An epoch's permuted tasks, as the master cuts them, with its ids."""
    starts = range(0, len(RECORDS), PER_TASK)
    return [task((epoch - 1) * len(starts) + i, start, min(start + PER_TASK, len(RECORDS)),
                 epoch=epoch) for i, start in enumerate(starts)]  # fmt: skip


def test_an_epochs_permuted_tasks_hold_every_record_once_and_another_set_each_epoch(split):
    reader = TaskRecords(SEED, lambda: split)
    epochs = {}
    for epoch in (1, 2, 3):
        tasks = [reader.read(t) for t in epoch_tasks(epoch)]
        assert sorted(r for records in tasks for r in records) == sorted(RECORDS)
        assert [len(records) for records in tasks] == [16, 16, 16, 2]
        epochs[epoch] = [frozenset(records) for records in tasks]
    # A task is a set drawn from both shards, not a range of one, and another set each epoch.
    first_shard = set(RECORDS[:30])
    assert all(len({r in first_shard for r in task_set}) == 2 for task_set in epochs[1][:3])
    assert len({task_set for sets in epochs.values() for task_set in sets}) == 12


def test_a_permuted_task_read_again_or_by_another_worker_holds_the_same_records(split):
    again = epoch_tasks(2)[1]
    first = TaskRecords(SEED, lambda: split).read(again)
    assert TaskRecords(SEED, lambda: split).read(again) == first  # the same order, too
    assert set(TaskRecords(SEED + 1, lambda: split).read(again)) != set(first)  # another job


def test_a_range_task_reads_its_range_and_only_training_shuffles_it(split):
    def never() -> list:
        raise AssertionError("a range task needs no split")

    reader = TaskRecords(SEED, never)
    shard = split[0][0]
    trained = reader.read(task(3, 10, 26, shard=shard, permuted=False))
    assert trained != RECORDS[10:26] and sorted(trained) == sorted(RECORDS[10:26])
    evaluated = task(9, 10, 26, shard=shard, kind=master_pb2.Task.EVALUATE, permuted=False)
    assert reader.read(evaluated) == RECORDS[10:26]


def test_the_worker_keeps_the_split_and_refuses_positions_past_its_end(split):
    reader = TaskRecords(SEED, lambda: split)
    first = reader.read(epoch_tasks(1)[0])
    for path, _ in split:
        os.remove(path)
        os.remove(index_path(path))
    assert reader.read(epoch_tasks(1)[0]) == first  # kept: not read again
    with pytest.raises(InputError, match=r"positions \[48, 60\) are outside .* \[0, 50\)"):
        reader.read(task(3, 48, 60))
    with pytest.raises(InputError, match=r"record index .* is missing"):
        TaskRecords(SEED, lambda: split).read(epoch_tasks(1)[0])  # a worker that never read it


def test_each_epoch_trains_a_task_in_an_order_of_its_own() -> None:
    first = shuffled(RECORDS, 0, task(3, 0, 0))
    assert sorted(first) == sorted(RECORDS) and first != RECORDS  # every record, once
    assert shuffled(RECORDS, 0, task(3, 0, 0, epoch=2)) != first  # the next epoch's order
    assert shuffled(RECORDS, 0, task(4, 0, 0)) != first  # and another task's
    assert shuffled(RECORDS, 1, task(3, 0, 0)) != first  # and another seed's


def test_a_retried_task_trains_in_the_same_order() -> None:
    assert shuffled(RECORDS, 7, task(3, 0, 0)) == shuffled(list(RECORDS), 7, task(3, 0, 0))
    assert shuffled([], 7, task(3, 0, 0)) == []
