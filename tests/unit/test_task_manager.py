"""The task manager: derived task ids, fenced leases, progress timeouts, re-queueing, poisoned
tasks, malformed reports, epochs, evaluation rounds, accounting, and journal replay. Time is a
fake clock, so lease expiry is exact and instant."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import time

import numpy as np
import pytest

from elastic_step.master.tasks.api import (
    EvaluationResult,
    InvalidReportError,
    Task,
    TaskKind,
    TaskSettings,
)
from elastic_step.master.tasks.task_manager import TaskManager

# Two training shards of 10 and 7 records, 4 records a task: 5 tasks and 17 records an epoch.
TRAIN = [("a", 10), ("b", 7)]
RECORDS_PER_EPOCH = 17
# One validation shard of 6 records: 2 evaluation tasks a round.
VALIDATION = [("v", 6)]
TIMEOUT = 10.0
LEASE_BASE = 7 << 32


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def settings(**overrides) -> TaskSettings:
    return TaskSettings(
        **{
            "train_shards": TRAIN,
            "validation_shards": [],
            "records_per_task": 4,
            "epochs": 1,
            "task_timeout_s": TIMEOUT,
            "max_task_retries": 3,
            "seed": 0,
            **overrides,
        }
    )


def make(clock=None, journal=None, **overrides) -> TaskManager:
    return TaskManager(
        settings(**overrides), lease_base=LEASE_BASE, clock=clock or FakeClock(), journal=journal
    )


def counted(accounting: list[dict]) -> list[dict]:
    """The records counted per epoch, without the model version each ended at."""
    return [{k: v for k, v in e.items() if k != "ended_at_version"} for e in accounting]


def key(task) -> tuple:
    return (task.shard, task.start, task.end)


def eval_result(loss_sum, count, *states) -> EvaluationResult:
    return EvaluationResult(loss_sum, count, [np.array(s, dtype=np.float64) for s in states])


def succeed(tm: TaskManager, task: Task, worker: str = "w", **kwargs) -> Task | None:
    return tm.report_success(task.id, worker=worker, lease_id=task.lease_id, **kwargs)


def fail(tm: TaskManager, task: Task, error: str, worker: str = "w") -> Task | None:
    return tm.report_failure(task.id, worker=worker, lease_id=task.lease_id, error=error)


def run_to_end(tm: TaskManager, worker: str = "w", version_from: int = 100) -> list[Task]:
    """Hands out and completes every task left; evaluation tasks report a fixed result."""
    done = []
    version = version_from
    while (task := tm.get_task(worker)) is not None:
        version += 1
        evaluation = None
        if task.kind is TaskKind.EVALUATE:
            evaluation = eval_result(1.0, task.records, [1.0, 1.0])
        assert succeed(tm, task, worker, model_version=version, evaluation=evaluation) == task
        done.append(task)
    return done


# -- splitting, ids and epochs --


def test_shards_are_split_into_records_per_task_pieces_with_a_partial_last_task() -> None:
    tm = make()
    tasks = []
    while (task := tm.get_task("w")) is not None:
        tasks.append(task)

    assert sorted(key(t) for t in tasks) == [
        ("a", 0, 4),
        ("a", 4, 8),
        ("a", 8, 10),
        ("b", 0, 4),
        ("b", 4, 7),
    ]
    assert all(t.kind is TaskKind.TRAIN and t.epoch == 1 for t in tasks)
    assert len({t.id for t in tasks}) == len(tasks)
    assert sum(t.records for t in tasks) == RECORDS_PER_EPOCH
    assert tm.doing_count() == 5


def test_permuted_training_tasks_cut_the_split_joined_and_evaluation_tasks_stay_ranges() -> None:
    # The worker reads a permuted task's positions in the training split's permutation for
    # the epoch (worker/task_records.py): the split's 17 records are one run of positions.
    journal: list[dict] = []
    overrides = {"epochs": 2, "validation_shards": VALIDATION, "permuted_training_tasks": True}
    tm = make(journal=journal.append, **overrides)
    tasks = run_to_end(tm)
    training = [t for t in tasks if t.kind is TaskKind.TRAIN]
    # In position order, every epoch: the records are already the epoch's permutation, and
    # the short task at the end goes last, as fit's short batch does.
    for epoch in (1, 2):
        assert [key(t) for t in training if t.epoch == epoch] == [
            ("", 0, 4), ("", 4, 8), ("", 8, 12), ("", 12, 16), ("", 16, 17)
        ]  # fmt: skip
    assert sorted(t.id for t in training) == list(range(10))
    assert all(t.permuted for t in training)
    evaluation = [t for t in tasks if t.kind is TaskKind.EVALUATE]
    assert evaluation and {(t.shard, t.permuted) for t in evaluation} == {("v", False)}
    first = training[0]
    assert first.describe() == (
        f"train task {first.id} (positions {first.start}-{first.end} of the training split's "
        "epoch-1 permutation)"
    )
    # A restarted master makes the same tasks from the same settings.
    replayed = TaskManager.restore(settings(**overrides), None, journal, lease_base=1 << 40)
    assert replayed.task(first.id) == dataclasses.replace(first, lease_id=None)  # done
    assert replayed.finished


def test_task_ids_follow_from_epoch_position_and_round() -> None:
    tm = make(epochs=2, validation_shards=VALIDATION)
    tasks = run_to_end(tm)
    split = [("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 4), ("b", 4, 7)]

    by_id = {t.id: t for t in tasks}
    # Epoch e, position i of the unshuffled split: (e - 1) * T + i, with T = 5.
    for epoch in (1, 2):
        for i, expected in enumerate(split):
            task = by_id[(epoch - 1) * 5 + i]
            assert (key(task), task.epoch, task.kind) == (expected, epoch, TaskKind.TRAIN)
    # Round r, position j of the validation split: epochs * T + r * V + j, with V = 2.
    for round_id, epoch in ((0, 1), (1, 2)):
        for j, expected in enumerate([("v", 0, 4), ("v", 4, 6)]):
            task = by_id[2 * 5 + round_id * 2 + j]
            assert (key(task), task.round, task.epoch) == (expected, round_id, epoch)
    assert len(by_id) == len(tasks) == 14
    rebuilt = tm.task(3)  # built again from the id alone
    assert (key(rebuilt), rebuilt.epoch, rebuilt.lease_id) == (key(by_id[3]), 1, None)
    assert tm.task(-1) is None and tm.task(10) is None  # round 0 is over: nothing to build


def test_shards_without_records_give_no_tasks() -> None:
    tm = make(train_shards=[("empty-1", 0), ("a", 5), ("empty-2", 0), ("b", 3)])
    tasks = run_to_end(tm)

    assert sorted((t.id, key(t)) for t in tasks) == [
        (0, ("a", 0, 4)),
        (1, ("a", 4, 5)),
        (2, ("b", 0, 3)),
    ]
    assert tm.records_per_epoch == 8 and tm.records_trained(1) == 8
    assert tm.finished


def test_a_training_split_without_records_is_refused() -> None:
    with pytest.raises(ValueError, match=r"training split has no records \(2 shards, all empty\)"):
        make(train_shards=[("a", 0), ("b", 0)])
    with pytest.raises(ValueError, match="training split has no records"):
        make(train_shards=[])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"records_per_task": 0}, "records_per_task is 0; it must be at least 1"),
        ({"epochs": 0}, "epochs is 0; it must be at least 1"),
        ({"evaluation_steps": -1}, "evaluation_steps is -1; it must be at least 0"),
        ({"max_task_retries": -2}, "max_task_retries is -2; it must be at least 0"),
        ({"task_timeout_s": 0.0}, "task_timeout_s is 0.0; it must be a positive"),
        ({"train_shards": [("a", -3)]}, "training shard a has -3 records"),
        ({"metric_shapes": ((2, -1),)}, r"metric_shapes is \(\(2, -1\),\); dimensions"),
        (
            {"task_kind": TaskKind.PREDICT, "permuted_training_tasks": True},
            "permuted_training_tasks is set for a prediction job; its tasks must be ranges",
        ),
    ],
)
def test_invalid_settings_name_the_value_and_the_rule(overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        settings(**overrides)


def test_the_next_epoch_is_created_only_when_the_todo_queue_runs_dry() -> None:
    tm = make(epochs=2)
    first = [tm.get_task("w") for _ in range(5)]
    assert all(t.epoch == 1 for t in first)
    assert tm.epochs_created == 1  # epoch 1's todo is empty now, but nobody asked yet

    sixth = tm.get_task("w")
    assert sixth.epoch == 2
    assert tm.epochs_created == 2
    # Epoch 1 is still running: its tasks are all in doing, not trained.
    assert tm.current_epoch == 1
    assert tm.records_trained(1) == 0


def test_the_last_epoch_is_not_followed_by_another() -> None:
    tm = make(epochs=2)
    tasks = run_to_end(tm)
    assert [t.epoch for t in tasks] == [1] * 5 + [2] * 5
    assert tm.epochs_created == 2
    assert tm.get_task("w") is None


def order_of_epochs(seed: int, epochs: int) -> list[list[tuple]]:
    tm = make(train_shards=[("s", 40)], records_per_task=2, epochs=epochs, seed=seed)
    orders = [[] for _ in range(epochs)]
    while (task := tm.get_task("w")) is not None:
        orders[task.epoch - 1].append(key(task))
    return orders


def test_epoch_order_is_shuffled_and_deterministic_for_a_seed() -> None:
    first, second = order_of_epochs(seed=7, epochs=2)
    in_file_order = [("s", i, i + 2) for i in range(0, 40, 2)]

    assert sorted(first) == in_file_order
    assert first != in_file_order  # shuffled
    assert second != first  # each epoch has its own order
    assert order_of_epochs(seed=7, epochs=2) == [first, second]  # same seed, same orders
    assert order_of_epochs(seed=8, epochs=1)[0] != first  # another seed, another order
    # The shuffle of earlier versions: Random(seed * 1_000_003 + epoch) over the split.
    positions = list(range(20))
    random.Random(7 * 1_000_003 + 1).shuffle(positions)
    assert first == [in_file_order[p] for p in positions]


# -- leases, fencing and progress --


def test_lease_ids_are_unique_and_count_up_from_the_lease_base() -> None:
    tm = make(epochs=2)
    tasks = run_to_end(tm)
    assert [t.lease_id for t in tasks] == list(range(LEASE_BASE, LEASE_BASE + 10))


def test_an_expired_lease_requeues_the_task_at_the_front_without_a_failure() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    slow = tm.get_task("w1")
    kept = tm.get_task("w2")
    clock.advance(6)
    assert tm.note_progress("w2", kept.lease_id, 1)
    clock.advance(6)  # w1's lease (10 s) ran out; w2's was renewed at t=6

    assert [(t.id, w) for t, w in tm.expire_leases()] == [(slow.id, "w1")]
    assert tm.expire_leases() == []
    assert tm.task(slow.id).failures == ()
    assert tm.failure is None
    assert tm.tasks_of("w1") == []
    assert tm.tasks_of("w2") == [kept]

    again = tm.get_task("w3")  # the front of todo, ahead of the 3 never-handed-out tasks
    assert again.id == slow.id
    assert again.lease_id != slow.lease_id
    assert tm.tasks_of("w3") == [again]


def test_a_lease_held_within_its_time_does_not_expire() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    tm.get_task("w1")
    clock.advance(TIMEOUT)
    assert tm.expire_leases() == []  # at the deadline, not past it
    assert tm.doing_count() == 1


def test_a_worker_that_heartbeats_without_progress_loses_its_task() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    stuck = tm.get_task("stuck")
    moving = tm.get_task("moving")
    assert tm.note_progress("stuck", stuck.lease_id, 3)
    for batches in range(4, 9):
        clock.advance(4)
        assert tm.note_progress("moving", moving.lease_id, batches)
        # The same count again, or a lower one, is no progress: it renews nothing.
        assert not tm.note_progress("stuck", stuck.lease_id, 3)
        assert not tm.note_progress("stuck", stuck.lease_id, 2)
        expired = tm.expire_leases()
        if clock.now <= TIMEOUT:
            assert expired == []
        else:
            assert [(t.id, w) for t, w in expired] == [(stuck.id, "stuck")]
            break
    else:
        pytest.fail("the stuck task never expired")
    assert tm.tasks_of("moving") == [moving]
    clock.advance(TIMEOUT + 1)
    assert [t.id for t, _ in tm.expire_leases()] == [moving.id]  # progress stopped at last
    assert tm.doing_count() == 0 and tm.failure is None


def test_progress_under_another_workers_or_an_unknown_lease_renews_nothing() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    task = tm.get_task("w1")
    clock.advance(6)
    assert not tm.note_progress("w2", task.lease_id, 5)  # not w2's lease
    assert not tm.note_progress("w1", task.lease_id + 1000, 5)  # no such lease
    clock.advance(6)
    assert [t.id for t, _ in tm.expire_leases()] == [task.id]
    assert not tm.note_progress("w1", task.lease_id, 6)  # the lease is gone


def test_a_stale_success_after_expiry_and_re_hand_out_changes_nothing() -> None:
    clock = FakeClock()
    tm = make(clock=clock, epochs=2)
    task = tm.get_task("slow")
    clock.advance(TIMEOUT + 1)
    tm.expire_leases()
    again = tm.get_task("fast")
    assert again.id == task.id
    before = tm.snapshot()

    # The slow worker finishes after all: its lease is gone, so its report is not counted.
    assert succeed(tm, task, "slow", model_version=1) is None
    assert tm.snapshot() == before
    assert succeed(tm, again, "fast", model_version=2) == again
    assert succeed(tm, again, "fast", model_version=3) is None  # done already
    run_to_end(tm)

    assert tm.records_trained(1) == RECORDS_PER_EPOCH
    assert counted(tm.epoch_accounting()) == [
        {"epoch": 1, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
        {"epoch": 2, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
    ]
    assert tm.finished


def test_a_report_with_a_wrong_lease_id_or_worker_changes_nothing() -> None:
    tm = make()
    task = tm.get_task("w1")
    before = tm.snapshot()

    assert tm.report_success(task.id, worker="w1", lease_id=task.lease_id + 1) is None
    assert tm.report_success(task.id, worker="w2", lease_id=task.lease_id) is None
    assert tm.report_failure(task.id, worker="w1", lease_id=task.lease_id - 1, error="x") is None
    assert tm.report_failure(task.id, worker="w2", lease_id=task.lease_id, error="x") is None
    assert tm.snapshot() == before
    assert succeed(tm, task, "w1") == task


def test_a_late_success_for_a_requeued_task_is_ignored_and_the_task_still_runs() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    task = tm.get_task("slow")
    clock.advance(TIMEOUT + 1)
    tm.expire_leases()

    assert succeed(tm, task, "slow") is None  # it is back in todo, not held by anyone
    done = run_to_end(tm)

    assert [t.id for t in done].count(task.id) == 1
    assert tm.records_trained(1) == RECORDS_PER_EPOCH


def test_a_duplicate_success_report_is_counted_once() -> None:
    tm = make()
    task = tm.get_task("w")
    assert succeed(tm, task) == task
    assert succeed(tm, task) is None
    assert tm.report_success(12345, worker="w", lease_id=task.lease_id) is None
    assert tm.records_trained(1) == task.records


def test_recover_tasks_requeues_only_the_dead_workers_tasks() -> None:
    tm = make()
    t1, t2 = tm.get_task("dead"), tm.get_task("dead")
    other = tm.get_task("alive")

    lost = tm.recover_tasks("dead")

    assert {t.id for t in lost} == {t1.id, t2.id}
    assert tm.tasks_of("dead") == []
    assert tm.tasks_of("alive") == [other]
    assert all(t.failures == () for t in lost)
    # They go to the front: the next two tasks handed out are the recovered ones.
    assert {tm.get_task("new").id, tm.get_task("new").id} == {t1.id, t2.id}
    assert tm.recover_tasks("nobody") == []


def test_recovering_without_a_death_never_counts_as_a_failure() -> None:
    tm = make(train_shards=[("a", 4)], max_task_retries=0)
    for _ in range(5):
        task = tm.get_task("w")
        assert [t.id for t in tm.recover_tasks("w")] == [task.id]
    assert tm.failure is None
    assert tm.task(task.id).failures == ()
    assert succeed(tm, tm.get_task("w")) is not None
    assert tm.finished


# -- failures --


def test_a_failed_task_is_retried_then_fails_the_job_with_its_error() -> None:
    tm = make(train_shards=[("a", 4)], max_task_retries=2)
    for attempt in (1, 2):
        task = tm.get_task("w")
        assert task is not None, f"task not handed out again after failure {attempt}"
        assert len(fail(tm, task, f"ValueError: bad row {attempt}").failures) == attempt
        assert tm.failure is None

    task = tm.get_task("w")
    assert task.id == 0
    failed = fail(tm, task, "ValueError: bad row 3")

    assert failed.failures == (
        "w: ValueError: bad row 1",
        "w: ValueError: bad row 2",
        "w: ValueError: bad row 3",
    )
    assert tm.failure == (
        "train task 0 (a records 0-4) failed 3 times, more than --max-task-retries=2: "
        "w: ValueError: bad row 1; w: ValueError: bad row 2; w: ValueError: bad row 3"
    )
    assert tm.get_task("w") is None  # a failed job hands out nothing
    assert not tm.finished


def test_a_failed_task_goes_behind_taken_back_tasks_ahead_of_new_ones() -> None:
    tm = make()
    failing, lost = tm.get_task("w1"), tm.get_task("w2")
    fail(tm, failing, "flaky", "w1")
    tm.recover_tasks("w2")
    assert [tm.get_task("w").id for _ in range(2)] == [lost.id, failing.id]


def test_a_failed_task_with_retries_left_is_not_dropped() -> None:
    tm = make(epochs=2)
    task = tm.get_task("w")
    fail(tm, task, "flaky")

    done = run_to_end(tm)

    assert [t.id for t in done].count(task.id) == 1
    assert tm.records_trained(1) == RECORDS_PER_EPOCH
    assert tm.records_trained(2) == RECORDS_PER_EPOCH
    assert tm.training_done and tm.finished


def test_a_late_failure_report_does_not_take_another_workers_lease() -> None:
    clock = FakeClock()
    tm = make(train_shards=[("a", 4)], clock=clock)
    task = tm.get_task("w1")
    clock.advance(TIMEOUT + 1)
    assert [t.id for t, _ in tm.expire_leases()] == [task.id]
    again = tm.get_task("w2")
    assert again.id == task.id
    # w1 was only slow: its failure report comes after the task went to w2.
    assert fail(tm, task, "timeout", "w1") is None
    assert tm.tasks_of("w2") == [again] and again.failures == ()
    assert succeed(tm, again, "w2") == again


def test_a_task_that_kills_each_worker_prefetching_it_fails_the_job_naming_it() -> None:
    """Each worker holds an innocent task and has prefetched the poisoned one, whose records
    its pipeline is feeding when it dies. Both go back to the front, so the next worker takes
    the same pair; both are charged each time, the prefetched one first, so the job's failure
    names the poisoned task."""
    tm = make(max_task_retries=2)
    innocent, poisoned = None, None
    for attempt in range(3):
        worker = f"worker-{attempt}"
        running = tm.get_task(worker)
        prefetched = tm.get_task(worker)
        if innocent is None:
            innocent, poisoned = running, prefetched
        assert (running.id, prefetched.id) == (innocent.id, poisoned.id)
        lost = tm.recover_tasks(worker, death=f"{worker} killed by SIGKILL")
        assert [t.id for t in lost] == [innocent.id, poisoned.id]
    assert tm.failure.startswith(f"train task {poisoned.id} (")
    assert "failed 3 times, more than --max-task-retries=2" in tm.failure
    assert f"task {innocent.id} (" not in tm.failure


def test_a_failure_report_for_an_unknown_task_is_ignored() -> None:
    tm = make()
    assert tm.report_failure(999, worker="w", lease_id=LEASE_BASE, error="boom") is None
    assert tm.failure is None


def test_a_task_whose_workers_keep_dying_fails_the_job_naming_it_and_each_death() -> None:
    tm = make(
        train_shards=[
            ("/d/train/shard-00000.tfrecord", 64),
            ("/d/train/shard-00001.tfrecord", 200),
        ],
        records_per_task=64,
    )
    poisoned = None
    for attempt in range(3):
        worker = f"worker-{attempt}"
        task = tm.get_task(worker)
        if poisoned is None:
            poisoned = task
        assert task.id == poisoned.id, "a recovered task goes to the front"
        [lost] = tm.recover_tasks(worker, death=f"{worker} killed by SIGKILL")
        assert len(lost.failures) == attempt + 1
        assert tm.failure is None
    task = tm.get_task("worker-3")
    assert task.id == poisoned.id
    tm.recover_tasks("worker-3", death="worker-3 OOMKilled")

    shard, start, end = key(poisoned)
    assert tm.failure == (
        f"train task {poisoned.id} ({shard} records {start}-{end}) failed 4 times, more than "
        "--max-task-retries=3: worker-0 killed by SIGKILL; worker-1 killed by SIGKILL; "
        "worker-2 killed by SIGKILL; worker-3 OOMKilled"
    )
    assert tm.get_task("worker-4") is None


def test_a_very_long_error_keeps_its_end() -> None:
    tm = make()
    task = tm.get_task("w")
    error = "Traceback (most recent call last):\n" + "  frame\n" * 1000 + "KeyError: 'label'"
    [cause] = fail(tm, task, error).failures
    assert len(cause) == 1000 and cause.startswith("...") and cause.endswith("KeyError: 'label'")


# -- malformed reports --


MALFORMED = {
    "no evaluation result": (None, "reported without an evaluation result"),
    "negative example count": (eval_result(1.0, -1, [1.0, 1.0]), "example_count is -1"),
    "another count of metric states": (
        eval_result(1.0, 2, [1.0, 1.0], [2.0]),
        "2 metric states; the round has 1",
    ),
    "another metric shape": (
        eval_result(1.0, 2, [1.0, 1.0, 1.0]),
        r"metric state 0 has shape \(3,\); the round has \(2,\)",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_evaluation_report_is_refused_and_the_task_handed_out_again(case) -> None:
    evaluation, message = MALFORMED[case]
    tm = make(validation_shards=[("v", 12)])
    run_training_of_epoch(tm)
    first = tm.get_task("w")
    assert succeed(tm, first, evaluation=eval_result(1.0, 4, [1.0, 2.0]), model_version=5)
    task = tm.get_task("w")
    before = tm.snapshot()

    with pytest.raises(InvalidReportError, match=message) as raised:
        succeed(tm, task, evaluation=evaluation, model_version=6)

    assert task.describe() in str(raised.value)
    assert tm.tasks_of("w") == []
    after = tm.snapshot()
    assert after["rounds"] == before["rounds"]  # the round's sums are untouched
    again = tm.get_task("w2")
    assert again.id == task.id  # handed out again first
    assert len(again.failures) == 1 and "w: invalid report" in again.failures[0]
    assert not tm.completed_rounds


def test_malformed_reports_on_one_task_fail_the_job_past_the_retry_limit() -> None:
    tm = make(validation_shards=[("v", 12)], max_task_retries=2)
    run_training_of_epoch(tm)
    for _ in range(3):
        task = tm.get_task("w")
        assert task.kind is TaskKind.EVALUATE
        with pytest.raises(InvalidReportError):
            succeed(tm, task, evaluation=None)
    assert tm.failure is not None and "more than --max-task-retries=2" in tm.failure
    assert tm.get_task("w") is None


def test_a_non_finite_loss_is_a_measurement_not_a_malformed_report() -> None:
    tm = make(validation_shards=[("v", 4)])
    run_training_of_epoch(tm)
    task = tm.get_task("w")
    assert succeed(tm, task, evaluation=eval_result(math.nan, 4, [1.0, 2.0]), model_version=9)
    [round_] = tm.completed_rounds
    assert math.isnan(round_.loss_sum)


def test_metric_shapes_from_the_settings_are_enforced_from_the_first_report() -> None:
    tm = make(validation_shards=VALIDATION, metric_shapes=((2,), ()))
    run_training_of_epoch(tm)
    task = tm.get_task("w")
    with pytest.raises(InvalidReportError, match=r"metric state 1 has shape \(1,\)"):
        succeed(tm, task, evaluation=eval_result(1.0, 4, [1.0, 1.0], [1.0]))
    task = tm.get_task("w")
    assert succeed(tm, task, evaluation=eval_result(1.0, 4, [1.0, 1.0], 1.0)) == task


def test_a_training_task_reported_with_an_evaluation_result_is_refused() -> None:
    tm = make()
    task = tm.get_task("w")
    with pytest.raises(InvalidReportError, match="training task was reported with an evaluation"):
        succeed(tm, task, evaluation=eval_result(1.0, 4, [1.0]))
    assert tm.records_trained(1) == 0
    assert tm.get_task("w").id == task.id


# -- evaluation --


def run_training_of_epoch(tm: TaskManager, first_version: int = 1) -> None:
    tasks = [tm.get_task("w") for _ in range(5)]
    for version, task in enumerate(tasks, start=first_version):
        assert task.kind is TaskKind.TRAIN
        succeed(tm, task, model_version=version)


def test_epoch_end_rounds_run_before_training_and_sum_their_results() -> None:
    tm = make(epochs=2, validation_shards=VALIDATION)
    run_training_of_epoch(tm)
    assert tm.records_trained(1) == RECORDS_PER_EPOCH

    # Epoch 2's tasks exist now too, but evaluation goes first.
    e1, e2 = tm.get_task("w1"), tm.get_task("w2")
    assert (e1.kind, e2.kind) == (TaskKind.EVALUATE, TaskKind.EVALUATE)
    assert sorted([key(e1), key(e2)]) == [("v", 0, 4), ("v", 4, 6)]
    assert e1.round == e2.round == 0 and e1.epoch == 1
    assert tm.get_task("w3").kind is TaskKind.TRAIN

    succeed(tm, e1, "w1", model_version=5, evaluation=eval_result(1.5, 4, [3.0, 4.0], 2.0))
    assert tm.completed_rounds == []
    succeed(tm, e2, "w2", model_version=5, evaluation=eval_result(0.5, 2, [1.0, 1.0], 1.0))

    [round_] = tm.completed_rounds
    assert (round_.trigger, round_.epoch, round_.model_version) == ("epoch-end", 1, 5)
    assert round_.loss_sum == pytest.approx(2.0)
    assert round_.example_count == 6
    np.testing.assert_allclose(round_.metric_states[0], [4.0, 5.0])
    np.testing.assert_allclose(round_.metric_states[1], 3.0)
    assert not tm.finished


def test_an_evaluation_round_records_the_lowest_and_highest_model_version() -> None:
    tm = make(validation_shards=[("v", 12)])
    run_training_of_epoch(tm)
    tasks = [tm.get_task(f"w{i}") for i in range(3)]
    for i, (task, version) in enumerate(zip(tasks, (9, 6, 8), strict=True)):
        succeed(tm, task, f"w{i}", model_version=version, evaluation=eval_result(1.0, 4, [1.0]))

    [round_] = tm.take_completed_rounds()
    assert (round_.min_model_version, round_.model_version) == (6, 9)
    assert tm.completed_rounds == []


def test_a_slow_worker_delays_the_next_round_but_rounds_stay_in_epoch_and_version_order() -> None:
    # Epoch 1's round has its last task held by a slow worker while training runs on and
    # epoch 2 ends. Epoch 2's round waits: none of its tasks goes out before epoch 1's last
    # is done, so it measures (pulls) a model no older than epoch 1's round did.
    tm = make(epochs=3, validation_shards=VALIDATION)
    run_training_of_epoch(tm, first_version=1)
    fast, slow = tm.get_task("fast"), tm.get_task("slow")
    assert (fast.round, slow.round) == (0, 0)
    succeed(tm, fast, "fast", model_version=5, evaluation=eval_result(1.0, 4, [1.0]))
    run_training_of_epoch(tm, first_version=6)  # epoch 2 ends at v10; its round starts
    training = tm.get_task("fast")
    assert training.kind is TaskKind.TRAIN  # of epoch 3: round 1 must wait
    assert not tm.completed_rounds
    succeed(tm, training, "fast", model_version=11)

    succeed(tm, slow, "slow", model_version=11, evaluation=eval_result(1.0, 2, [1.0]))
    second = [tm.get_task("w"), tm.get_task("w")]
    assert [t.round for t in second] == [1, 1]
    for task in second:
        succeed(tm, task, model_version=12, evaluation=eval_result(1.0, task.records, [1.0]))
    run_to_end(tm, version_from=20)

    rounds = tm.completed_rounds
    assert [(r.id, r.epoch, r.trigger) for r in rounds] == [
        (0, 1, "epoch-end"),
        (1, 2, "epoch-end"),
        (2, 3, "epoch-end"),
    ]
    for before, after in itertools.pairwise(rounds):
        assert after.min_model_version >= before.model_version


def test_after_training_the_rounds_left_go_out_together_and_complete_in_order() -> None:
    # The model no longer changes: the next round need not wait for the slow worker's task,
    # but it is completed only after the round before it.
    tm = make(epochs=2, validation_shards=VALIDATION)
    run_training_of_epoch(tm, first_version=1)
    fast, slow = tm.get_task("w"), tm.get_task("slow")
    assert (fast.round, slow.round) == (0, 0)
    succeed(tm, fast, model_version=5, evaluation=eval_result(1.0, 4, [1.0]))
    run_training_of_epoch(tm, first_version=6)
    assert tm.training_done
    rest = [tm.get_task("w") for _ in range(2)]
    assert [t.round for t in rest] == [1, 1]
    for task in rest:
        succeed(tm, task, model_version=10, evaluation=eval_result(1.0, task.records, [1.0]))
    assert tm.completed_rounds == [] and not tm.finished  # round 1 waits for round 0
    succeed(tm, slow, "slow", model_version=10, evaluation=eval_result(1.0, 2, [1.0]))
    assert [(r.id, r.epoch) for r in tm.completed_rounds] == [(0, 1), (1, 2)]
    assert tm.finished


def test_an_epoch_that_ends_before_an_older_one_waits_for_its_round() -> None:
    # One task of epoch 1 is held by a slow worker while all of epoch 2 trains: epoch 2
    # ends first. Its round starts only after epoch 1's, and a restore keeps that order.
    journal: list[dict] = []
    tm = make(epochs=2, validation_shards=VALIDATION, journal=journal.append)
    first = [tm.get_task("w") for _ in range(5)]
    for task in first[:4]:
        succeed(tm, task, model_version=1)
    run_training_of_epoch(tm, first_version=2)  # all of epoch 2
    assert tm.get_task("w") is None and not tm.completed_rounds  # no round for epoch 2 yet

    restored = TaskManager.restore(
        settings(epochs=2, validation_shards=VALIDATION),
        tm.snapshot(),
        [],
        lease_base=LEASE_BASE + 1,
    )
    for manager in (tm, restored):
        lease = manager.task(first[4].id).lease_id
        assert manager.report_success(first[4].id, worker="w", lease_id=lease, model_version=7)
        run_to_end(manager, version_from=10)
        assert [(r.epoch, r.id) for r in manager.completed_rounds] == [(1, 0), (2, 1)]
    replayed = TaskManager.restore(
        settings(epochs=2, validation_shards=VALIDATION), None, journal, lease_base=LEASE_BASE
    )
    assert [(r.epoch, r.id) for r in replayed.completed_rounds] == [(1, 0), (2, 1)]


def test_the_job_finishes_only_after_the_final_round() -> None:
    tm = make(validation_shards=VALIDATION)
    training = [tm.get_task("w") for _ in range(5)]
    for task in training:
        assert not tm.finished
        succeed(tm, task, model_version=7)

    assert tm.training_done
    assert not tm.finished  # the final evaluation round is pending
    e1, e2 = tm.get_task("w"), tm.get_task("w")
    succeed(tm, e1, evaluation=eval_result(1.0, 4, [1.0]))
    assert not tm.finished
    succeed(tm, e2, evaluation=eval_result(1.0, 2, [1.0]))

    assert tm.finished
    assert [(r.trigger, r.epoch, r.example_count) for r in tm.completed_rounds] == [
        ("epoch-end", 1, 6)
    ]
    assert tm.get_task("w") is None


def test_a_failed_evaluation_task_is_retried() -> None:
    tm = make(validation_shards=VALIDATION)
    run_training_of_epoch(tm)
    evaluation = tm.get_task("w")
    assert evaluation.kind is TaskKind.EVALUATE
    fail(tm, evaluation, "OOM")

    run_to_end(tm)

    assert tm.finished
    assert tm.completed_rounds[0].example_count == 6


def test_evaluation_every_evaluation_steps_model_versions() -> None:
    tm = make(train_shards=[("a", 40)], validation_shards=[("v", 4)], evaluation_steps=3)
    tm.observe_model_version(2)
    assert tm.get_task("w").kind is TaskKind.TRAIN

    tm.observe_model_version(3)
    evaluation = tm.get_task("w")
    assert evaluation.kind is TaskKind.EVALUATE

    # While that round is pending, more steps do not pile up rounds.
    tm.observe_model_version(6)
    tm.observe_model_version(7)
    assert tm.get_task("w").kind is TaskKind.TRAIN
    succeed(tm, evaluation, model_version=3, evaluation=eval_result(2.0, 4, [1.0]))
    [steps_round] = tm.completed_rounds
    assert (steps_round.trigger, steps_round.model_version) == ("steps", 3)

    tm.observe_model_version(9)
    second = tm.get_task("w")
    assert second.kind is TaskKind.EVALUATE
    succeed(tm, second, model_version=9, evaluation=eval_result(2.0, 4, [1.0]))
    assert [r.model_version for r in tm.completed_rounds] == [3, 9]
    # A model version going backwards (a late report) starts nothing.
    tm.observe_model_version(4)
    assert tm.model_version == 9
    assert tm.get_task("w").kind is TaskKind.TRAIN


def test_model_versions_from_success_reports_trigger_evaluation() -> None:
    tm = make(train_shards=[("a", 40)], validation_shards=[("v", 4)], evaluation_steps=5)
    task = tm.get_task("w")
    succeed(tm, task, model_version=5)
    assert tm.get_task("w").kind is TaskKind.EVALUATE


def test_without_validation_shards_there_are_no_rounds() -> None:
    tm = make(epochs=2, evaluation_steps=2)
    run_to_end(tm, version_from=0)
    assert tm.model_version == 10  # past several evaluation_steps boundaries
    assert tm.completed_rounds == []
    assert tm.training_done and tm.finished
    assert tm.get_task("w") is None


def test_a_validation_split_without_records_starts_no_rounds() -> None:
    tm = make(epochs=2, evaluation_steps=2, validation_shards=[("v", 0), ("w", 0)])
    tasks = run_to_end(tm, version_from=0)
    assert all(t.kind is TaskKind.TRAIN for t in tasks)
    assert tm.completed_rounds == []
    assert tm.finished


# -- persistence --


def restored(tm: TaskManager, records: list[dict], clock, **kwargs) -> TaskManager:
    return TaskManager.restore(
        tm.settings,
        None,
        json.loads(json.dumps(records)),
        lease_base=kwargs.pop("lease_base", LEASE_BASE),
        clock=clock,
        **kwargs,
    )


def test_restore_mid_epoch_continues_with_exact_accounting() -> None:
    clock = FakeClock()
    records: list[dict] = []
    tm = make(
        clock=clock,
        journal=records.append,
        validation_shards=VALIDATION,
        epochs=2,
        seed=3,
    )
    run_training_of_epoch(tm)
    # Round 0 is pending: one evaluation task reported, one held by w2.
    e1, e2 = tm.get_task("w1"), tm.get_task("w2")
    succeed(tm, e1, "w1", model_version=5, evaluation=eval_result(1.5, 4, [3.0, 4.0], 2.0))
    # Epoch 2: one task done, one failed once and back in todo, one held by w3.
    done_before = tm.get_task("w1")
    succeed(tm, done_before, "w1", model_version=6)
    flaky = tm.get_task("w1")
    fail(tm, flaky, "flaky", "w1")
    held = tm.get_task("w3")
    assert tm.note_progress("w3", held.lease_id, 4)
    seen_ids = {t.id for t in (e1, e2, done_before, flaky, held)}

    snapshot = json.loads(json.dumps(tm.snapshot()))
    clock.advance(1000)  # every lease of the old master has run out by now
    new_base = LEASE_BASE + (1 << 32)
    again = TaskManager.restore(tm.settings, snapshot, [], lease_base=new_base, clock=clock)
    # The same state, but for the next lease id: it comes from the new base.
    assert {**again.snapshot(), "next_lease_id": 0} == {**snapshot, "next_lease_id": 0}

    # Tasks in doing keep their worker and lease and get fresh deadlines.
    assert [(t.id, t.lease_id) for t in again.tasks_of("w2")] == [(e2.id, e2.lease_id)]
    assert [(t.id, t.lease_id) for t in again.tasks_of("w3")] == [(held.id, held.lease_id)]
    clock.advance(9)
    assert again.expire_leases() == []
    assert again.note_progress("w2", e2.lease_id, 1)
    assert not again.note_progress("w3", held.lease_id, 4)  # no progress since the save
    clock.advance(9)
    assert [(t.id, w) for t, w in again.expire_leases()] == [(held.id, "w3")]
    assert again.records_trained(1) == RECORDS_PER_EPOCH
    assert again.records_trained(2) == done_before.records
    assert again.model_version == 6

    # The pending round completes with the partial result saved before the restart.
    evaluation = eval_result(0.5, 2, [1.0, 1.0], 1.0)
    assert succeed(again, e2, "w2", model_version=6, evaluation=evaluation) is not None
    [round_] = again.take_completed_rounds()
    assert (round_.id, round_.epoch, round_.example_count) == (0, 1, 6)
    assert (round_.min_model_version, round_.model_version) == (5, 6)
    assert round_.loss_sum == pytest.approx(2.0)
    np.testing.assert_allclose(round_.metric_states[0], [4.0, 5.0])
    np.testing.assert_allclose(round_.metric_states[1], 3.0)

    rest = run_to_end(again)
    assert all(t.lease_id >= new_base for t in rest)  # new lease ids from the new base
    retried = [t for t in rest if t.id == flaky.id]
    assert len(retried) == 1 and retried[0].failures == ("w1: flaky",)
    # Epoch 2's other 4 tasks, each once: the expired one, the failed one and two never run.
    trained_after = [t.id for t in rest if t.kind is TaskKind.TRAIN]
    assert len(trained_after) == len(set(trained_after)) == 4
    assert {held.id, flaky.id} <= set(trained_after)
    assert done_before.id not in trained_after
    final_round = [t for t in rest if t.kind is TaskKind.EVALUATE]
    assert len(final_round) == 2
    assert not seen_ids & {t.id for t in final_round}  # a new round has new ids
    assert counted(again.epoch_accounting()) == [
        {"epoch": 1, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
        {"epoch": 2, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
    ]
    assert [(r.id, r.trigger, r.epoch) for r in again.completed_rounds] == [(1, "epoch-end", 2)]
    assert again.finished


def test_restore_keeps_a_failure_and_recover_works_on_restored_tasks() -> None:
    records: list[dict] = []
    tm = make(journal=records.append, train_shards=[("a", 4), ("b", 4)], max_task_retries=0)
    held = tm.get_task("w1")

    clock = FakeClock()
    again = restored(tm, records, clock, journal=records.append)
    assert [t.id for t in again.recover_tasks("w1")] == [held.id]
    assert again.get_task("w2").id == held.id

    failing = again.get_task("w2")
    fail(again, failing, "KeyError: 'label'", "w2")
    third = restored(again, records, clock)
    assert third.failure is not None and "w2: KeyError: 'label'" in third.failure
    assert third.get_task("w2") is None


def test_an_adopted_workers_report_is_accepted_after_a_restore() -> None:
    records: list[dict] = []
    tm = make(journal=records.append)
    task = tm.get_task("w")
    again = restored(tm, records, FakeClock(), lease_base=LEASE_BASE + (1 << 32))
    assert succeed(again, task, "w") == task
    assert again.get_task("w").lease_id == LEASE_BASE + (1 << 32)


def test_a_lease_base_below_the_journaled_leases_still_gives_new_lease_ids() -> None:
    records: list[dict] = []
    tm = make(journal=records.append)
    handed = [tm.get_task("w") for _ in range(3)]
    again = restored(tm, records, FakeClock(), lease_base=0)
    assert again.get_task("w").lease_id == handed[-1].lease_id + 1


def test_taken_rounds_are_not_returned_again_after_a_restore() -> None:
    records: list[dict] = []
    tm = make(journal=records.append, validation_shards=VALIDATION, epochs=2)
    run_training_of_epoch(tm)
    for task in (tm.get_task("w"), tm.get_task("w")):
        succeed(tm, task, evaluation=eval_result(1.0, 3, [1.0]))
    assert [r.id for r in restored(tm, records, FakeClock()).completed_rounds] == [0]
    assert [r.id for r in tm.take_completed_rounds()] == [0]
    assert restored(tm, records, FakeClock()).completed_rounds == []
    assert tm.take_completed_rounds() == []


def test_a_snapshot_of_other_data_is_refused() -> None:
    tm = make()
    snapshot = tm.snapshot()
    with pytest.raises(
        ValueError, match="5 training and 0 evaluation tasks a round, the data now 6"
    ):
        TaskManager.restore(
            settings(train_shards=[*TRAIN, ("c", 1)]), snapshot, [], lease_base=LEASE_BASE
        )


def random_run(seed: int, max_task_retries: int, steps: int):
    """Runs a seeded random mix of every operation; returns the settings, each record
    (through JSON) with the snapshot taken right after it, and the manager."""
    clock = FakeClock()
    records: list[dict] = []
    snapshots: list[dict] = []
    config = settings(
        train_shards=[("a", 10), ("empty", 0), ("b", 7), ("c", 3)],
        validation_shards=[("v", 6), ("w", 0), ("x", 3)],
        epochs=12,
        evaluation_steps=7,
        max_task_retries=max_task_retries,
        seed=seed,
    )

    def journal(record: dict) -> None:
        records.append(json.loads(json.dumps(record)))
        snapshots.append(json.loads(json.dumps(tm.snapshot())))

    tm = TaskManager(config, lease_base=LEASE_BASE, clock=clock, journal=journal)
    rng = random.Random(seed)
    workers = [f"worker-{i}" for i in range(4)]
    version = 0
    for _ in range(steps):
        if tm.finished or tm.failure:
            break
        worker = rng.choice(workers)
        held = tm.tasks_of(worker)
        task = held[0] if held else None
        op = rng.random()
        if op < 0.3 or task is None:
            tm.get_task(worker)
        elif op < 0.55:
            version += rng.randint(0, 2)
            evaluation = None
            if task.kind is TaskKind.EVALUATE:
                evaluation = eval_result(rng.random(), task.records, [rng.random(), 1.0])
            if rng.random() < 0.05:  # malformed: no result, or one for a training task
                evaluation = None if evaluation else eval_result(1.0, 1, [1.0])
                with pytest.raises(InvalidReportError):
                    succeed(tm, task, worker, model_version=version, evaluation=evaluation)
            else:
                succeed(tm, task, worker, model_version=version, evaluation=evaluation)
        elif op < 0.6:
            fail(tm, task, f"ValueError: {rng.random()}", worker)
        elif op < 0.65:
            tm.recover_tasks(worker, death=rng.choice([None, f"{worker} killed by SIGKILL"]))
        elif op < 0.75:
            clock.advance(rng.uniform(0, 6))
            tm.expire_leases()
        elif op < 0.85:
            tm.note_progress(worker, task.lease_id, rng.randint(0, 6))
        elif op < 0.9:
            tm.observe_model_version(version + rng.randint(-3, 3))
        elif op < 0.95:
            tm.take_completed_rounds()
        else:  # a stale report: another lease id
            assert tm.report_success(task.id, worker=worker, lease_id=task.lease_id + 1) is None
    return config, records, snapshots, tm


@pytest.mark.parametrize(
    ("seed", "max_task_retries", "fails"), [(1, 6, False), (4, 6, False), (1, 2, True)]
)
def test_journal_replay_gives_the_state_of_every_moment(seed, max_task_retries, fails) -> None:
    config, records, snapshots, tm = random_run(seed, max_task_retries, steps=3000)
    kinds = {r["op"] for r in records}
    # O(1) each: only an evaluation report carries more, its metric states.
    assert max(len(json.dumps(r)) for r in records if "eval" not in r) < 200
    assert kinds == {"epoch", "lease", "progress", "release", "fail", "done", "version", "taken"}
    if fails:
        assert "more than --max-task-retries=2" in tm.failure
    else:
        assert tm.finished
    assert snapshots[-1] == tm.snapshot()
    empty = TaskManager(config, lease_base=LEASE_BASE).snapshot()
    states = [empty, *snapshots]

    def restore(snapshot, tail):
        return TaskManager.restore(config, snapshot, tail, lease_base=LEASE_BASE, clock=FakeClock())

    for k, state in enumerate(states):
        assert restore(None, records[:k]).snapshot() == state, f"after {k} records"
        assert restore(state, records[k:]).snapshot() == snapshots[-1], f"from record {k}"


def test_a_restored_manager_can_run_the_job_to_its_end() -> None:
    config, records, snapshots, tm = random_run(4, 6, steps=250)
    assert not tm.finished
    again = TaskManager.restore(
        config, snapshots[100], records[101:], lease_base=LEASE_BASE + (1 << 32)
    )
    for i in range(4):  # the old workers are gone
        again.recover_tasks(f"worker-{i}")
    run_to_end(again)
    assert again.finished
    assert all(a["records_trained"] == a["records_expected"] for a in again.epoch_accounting())


# -- scale --

BIG_TRAIN = [(f"/d/train/shard-{i:05d}.tfrecord", 1000) for i in range(100)]


def test_a_snapshot_with_100k_tasks_an_epoch_stays_under_1_mb() -> None:
    tm = make(train_shards=BIG_TRAIN, records_per_task=1, epochs=3)
    for _ in range(100_000 + 50_000):  # epoch 1 and half of epoch 2
        succeed(tm, tm.get_task("w"), model_version=1)
    for i, task in enumerate([tm.get_task("w") for _ in range(200)]):  # failures to store
        fail(tm, task, f"ValueError: bad record in row {i} of the shard")
    for i in range(1000):
        tm.get_task(f"worker-{i % 100}")

    snapshot = tm.snapshot()
    size = len(json.dumps(snapshot))
    print(f"snapshot of 100,000 tasks an epoch, epoch 2 half done, 1,000 leases: {size:,} bytes")
    assert size <= 1_000_000
    assert tm.records_trained(2) == 50_000 and tm.doing_count() == 1000
    again = TaskManager.restore(tm.settings, json.loads(json.dumps(snapshot)), [], lease_base=0)
    assert again.snapshot() == snapshot


def test_handing_out_and_reporting_100k_tasks() -> None:
    tm = make(train_shards=BIG_TRAIN, records_per_task=1)
    start = time.perf_counter()
    count = 0
    while (task := tm.get_task("w")) is not None:
        succeed(tm, task, model_version=count)
        count += 1
    elapsed = time.perf_counter() - start
    print(f"100,000 tasks handed out and reported in {elapsed:.2f} s")
    assert count == 100_000
    assert tm.finished and tm.records_trained(1) == 100_000


# -- prediction jobs --


def test_a_prediction_job_hands_out_predict_tasks_with_their_first_row_index() -> None:
    tm = make(task_kind=TaskKind.PREDICT)
    tasks = tm.epoch_tasks(1)
    assert {t.kind for t in tasks} == {TaskKind.PREDICT}
    # Shard a's 10 records then shard b's 7, 4 a task: every record has one index, in order.
    assert [(key(t), t.first_index) for t in tasks] == [
        (("a", 0, 4), 0), (("a", 4, 8), 4), (("a", 8, 10), 8), (("b", 0, 4), 10), (("b", 4, 7), 14),
    ]  # fmt: skip
    handed = []
    while (task := tm.get_task("w")) is not None:
        assert task.kind is TaskKind.PREDICT and task.first_index == tasks[task.id].first_index
        handed.append(task.id)
        assert succeed(tm, task) is not None
    assert sorted(handed) == [t.id for t in tasks]
    assert tm.finished and tm.records_trained(1) == RECORDS_PER_EPOCH


def test_a_prediction_task_reported_with_an_evaluation_result_is_refused() -> None:
    tm = make(task_kind=TaskKind.PREDICT)
    task = tm.get_task("w")
    with pytest.raises(
        InvalidReportError, match="a prediction task was reported with an evaluation"
    ):
        succeed(tm, task, evaluation=eval_result(1.0, 4))


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        (TaskKind.PREDICT, {"epochs": 2}),
        (TaskKind.PREDICT, {"validation_shards": VALIDATION}),
        (TaskKind.EVALUATE, {}),
    ],
)
def test_a_prediction_job_has_one_epoch_and_no_validation(kind, overrides) -> None:
    with pytest.raises(ValueError, match=r"a prediction job has one epoch|task_kind is evaluate"):
        settings(task_kind=kind, **overrides)
