"""The order in which a worker trains a task's records (elastic_step/worker/worker.py,
``shuffled``): drawn from the job's seed, the task and its epoch, as fit shuffles each epoch."""

from __future__ import annotations

from elastic_step.rpc import master_pb2
from elastic_step.worker.worker import shuffled

RECORDS = [f"record {i}".encode() for i in range(64)]


def task(task_id: int, epoch: int) -> master_pb2.Task:
    return master_pb2.Task(kind=master_pb2.Task.TRAIN, id=task_id, epoch=epoch)


def test_each_epoch_trains_a_task_in_an_order_of_its_own() -> None:
    first = shuffled(RECORDS, 0, task(3, 1))
    assert sorted(first) == sorted(RECORDS) and first != RECORDS  # every record, once
    assert shuffled(RECORDS, 0, task(3, 2)) != first  # the next epoch's order differs
    assert shuffled(RECORDS, 0, task(4, 1)) != first  # and another task's
    assert shuffled(RECORDS, 1, task(3, 1)) != first  # and another seed's


def test_a_retried_task_trains_in_the_same_order() -> None:
    assert shuffled(RECORDS, 7, task(3, 1)) == shuffled(list(RECORDS), 7, task(3, 1))
    assert shuffled([], 7, task(3, 1)) == []
