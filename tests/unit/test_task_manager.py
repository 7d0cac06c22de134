"""The task manager: leases, re-queueing, retries, epochs, evaluation rounds, accounting and
a persistence round-trip. Time is a fake clock, so lease expiry is exact and instant."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic_step.master.task_manager import (
    EvaluationResult,
    TaskKind,
    TaskManager,
    TaskSettings,
)

# Two training shards of 10 and 7 records, 4 records a task: 5 tasks and 17 records an epoch.
TRAIN = [("a", 10), ("b", 7)]
RECORDS_PER_EPOCH = 17
# One validation shard of 6 records: 2 evaluation tasks a round.
VALIDATION = [("v", 6)]


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(clock=None, **overrides) -> TaskManager:
    settings = {
        "train_shards": TRAIN,
        "validation_shards": [],
        "records_per_task": 4,
        "epochs": 1,
        "lease_s": 10.0,
        "max_task_retries": 3,
        "seed": 0,
        **overrides,
    }
    return TaskManager(TaskSettings(**settings), clock=clock or FakeClock())


def key(task) -> tuple:
    return (task.shard, task.start, task.end)


def eval_result(loss_sum, count, *states) -> EvaluationResult:
    return EvaluationResult(loss_sum, count, [np.array(s, dtype=np.float64) for s in states])


def run_to_end(tm: TaskManager, worker: str = "w", version_from: int = 100) -> list:
    """Hands out and completes every task left; evaluation tasks report a fixed result."""
    done = []
    version = version_from
    while (task := tm.get_task(worker)) is not None:
        version += 1
        if task.kind is TaskKind.EVALUATE:
            result = eval_result(1.0, task.records, [1.0, 1.0])
            assert tm.report_success(task.id, model_version=version, evaluation=result) is task
        else:
            assert tm.report_success(task.id, model_version=version) is task
        done.append(task)
    return done


# -- splitting and epochs --


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


# -- leases and lost workers --


def test_an_expired_lease_requeues_the_task_at_the_front_without_a_failure() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    slow = tm.get_task("w1")
    kept = tm.get_task("w2")
    clock.advance(6)
    tm.renew_leases("w2")
    clock.advance(6)  # w1's lease (10 s) ran out; w2's was renewed at t=6

    assert [(t.id, w) for t, w in tm.expire_leases()] == [(slow.id, "w1")]
    assert tm.expire_leases() == []
    assert slow.failures == 0
    assert tm.failure is None
    assert tm.tasks_of("w1") == []
    assert tm.tasks_of("w2") == [kept]

    again = tm.get_task("w3")  # the front of todo, ahead of the 3 never-handed-out tasks
    assert again.id == slow.id
    assert tm.tasks_of("w3") == [again]


def test_a_lease_held_within_its_time_does_not_expire() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    tm.get_task("w1")
    clock.advance(9)
    assert tm.expire_leases() == []
    assert tm.doing_count() == 1


def test_recover_tasks_requeues_only_the_dead_workers_tasks() -> None:
    tm = make()
    t1, t2 = tm.get_task("dead"), tm.get_task("dead")
    other = tm.get_task("alive")

    lost = tm.recover_tasks("dead")

    assert {t.id for t in lost} == {t1.id, t2.id}
    assert tm.tasks_of("dead") == []
    assert tm.tasks_of("alive") == [other]
    assert all(t.failures == 0 for t in lost)
    # They go to the front: the next two tasks handed out are the recovered ones.
    assert {tm.get_task("new").id, tm.get_task("new").id} == {t1.id, t2.id}
    assert tm.recover_tasks("nobody") == []


# -- failures --


def test_a_failed_task_is_retried_then_fails_the_job_with_its_error() -> None:
    tm = make(train_shards=[("a", 4)], max_task_retries=2)
    for attempt in (1, 2):
        task = tm.get_task("w")
        assert task is not None, f"task not handed out again after failure {attempt}"
        assert tm.report_failure(task.id, f"ValueError: bad row {attempt}", "w").failures == attempt
        assert tm.failure is None

    task = tm.get_task("w")
    assert task.id == 0
    tm.report_failure(task.id, "ValueError: bad row 3", "w")

    assert tm.failure is not None
    assert "train task 0 (a records 0-4)" in tm.failure
    assert "failed 3 times" in tm.failure
    assert "--max-task-retries=2" in tm.failure
    assert "ValueError: bad row 3" in tm.failure
    assert tm.get_task("w") is None  # a failed job hands out nothing
    assert not tm.finished


def test_a_failed_task_with_retries_left_is_not_dropped() -> None:
    tm = make(epochs=2)
    task = tm.get_task("w")
    tm.report_failure(task.id, "flaky", "w")

    done = run_to_end(tm)

    assert [t.id for t in done].count(task.id) == 1
    assert tm.records_trained(1) == RECORDS_PER_EPOCH
    assert tm.records_trained(2) == RECORDS_PER_EPOCH
    assert tm.training_done and tm.finished


def test_a_late_failure_report_does_not_take_another_workers_lease() -> None:
    clock = FakeClock()
    tm = make(train_shards=[("a", 4)], clock=clock)
    task = tm.get_task("w1")
    clock.now += 10.0 + 1
    assert [t.id for t, _ in tm.expire_leases()] == [task.id]
    assert tm.get_task("w2").id == task.id
    # w1 was only slow: its failure report comes after the task went to w2.
    assert tm.report_failure(task.id, "timeout", "w1") is None
    assert tm.tasks_of("w2") == [task] and task.failures == 0
    assert tm.report_success(task.id) is task


def test_a_failure_report_for_an_unknown_task_is_ignored() -> None:
    tm = make()
    assert tm.report_failure(999, "boom", "w") is None
    assert tm.failure is None


# -- counting each task once --


def test_a_task_run_twice_after_its_lease_expired_is_counted_once() -> None:
    clock = FakeClock()
    tm = make(clock=clock, epochs=2)
    task = tm.get_task("slow")
    clock.advance(11)
    tm.expire_leases()
    again = tm.get_task("fast")
    assert again.id == task.id

    assert tm.report_success(task.id, model_version=1) is not None  # the slow one finishes
    assert tm.report_success(again.id, model_version=2) is None  # the re-run is not counted
    run_to_end(tm)

    assert tm.records_trained(1) == RECORDS_PER_EPOCH
    assert tm.epoch_accounting() == [
        {"epoch": 1, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
        {"epoch": 2, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
    ]
    assert tm.finished


def test_a_late_success_for_a_requeued_task_is_ignored_and_the_task_still_runs() -> None:
    clock = FakeClock()
    tm = make(clock=clock)
    task = tm.get_task("slow")
    clock.advance(11)
    tm.expire_leases()

    assert tm.report_success(task.id) is None  # it is back in todo, not held by anyone
    done = run_to_end(tm)

    assert [t.id for t in done].count(task.id) == 1
    assert tm.records_trained(1) == RECORDS_PER_EPOCH


def test_a_duplicate_success_report_is_counted_once() -> None:
    tm = make()
    task = tm.get_task("w")
    assert tm.report_success(task.id) is task
    assert tm.report_success(task.id) is None
    assert tm.report_success(12345) is None
    assert tm.records_trained(1) == task.records


# -- evaluation --


def test_epoch_end_rounds_run_before_training_and_sum_their_results() -> None:
    tm = make(epochs=2, validation_shards=VALIDATION)
    epoch1 = [tm.get_task("w") for _ in range(5)]
    for version, task in enumerate(epoch1, start=1):
        tm.report_success(task.id, model_version=version)
    assert tm.records_trained(1) == RECORDS_PER_EPOCH

    # Epoch 2's tasks exist now too, but evaluation goes first.
    e1, e2 = tm.get_task("w1"), tm.get_task("w2")
    assert (e1.kind, e2.kind) == (TaskKind.EVALUATE, TaskKind.EVALUATE)
    assert sorted([key(e1), key(e2)]) == [("v", 0, 4), ("v", 4, 6)]
    assert e1.round == e2.round == 0 and e1.epoch == 1
    assert tm.get_task("w3").kind is TaskKind.TRAIN

    tm.report_success(e1.id, evaluation=eval_result(1.5, 4, [3.0, 4.0], 2.0))
    assert tm.completed_rounds == []
    tm.report_success(e2.id, evaluation=eval_result(0.5, 2, [1.0, 1.0], 1.0))

    [round_] = tm.completed_rounds
    assert (round_.trigger, round_.epoch, round_.model_version) == ("epoch-end", 1, 5)
    assert round_.loss_sum == pytest.approx(2.0)
    assert round_.example_count == 6
    np.testing.assert_allclose(round_.metric_states[0], [4.0, 5.0])
    np.testing.assert_allclose(round_.metric_states[1], 3.0)
    assert not tm.finished


def test_the_job_finishes_only_after_the_final_round() -> None:
    tm = make(validation_shards=VALIDATION)
    training = [tm.get_task("w") for _ in range(5)]
    for task in training:
        assert not tm.finished
        tm.report_success(task.id, model_version=7)

    assert tm.training_done
    assert not tm.finished  # the final evaluation round is pending
    e1, e2 = tm.get_task("w"), tm.get_task("w")
    tm.report_success(e1.id, evaluation=eval_result(1.0, 4, [1.0]))
    assert not tm.finished
    tm.report_success(e2.id, evaluation=eval_result(1.0, 2, [1.0]))

    assert tm.finished
    assert [(r.trigger, r.epoch, r.example_count) for r in tm.completed_rounds] == [
        ("epoch-end", 1, 6)
    ]
    assert tm.get_task("w") is None


def test_a_failed_evaluation_task_is_retried() -> None:
    tm = make(validation_shards=VALIDATION)
    training = [tm.get_task("w") for _ in range(5)]
    for task in training:
        tm.report_success(task.id)
    evaluation = tm.get_task("w")
    tm.report_failure(evaluation.id, "OOM", "w")

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
    tm.report_success(evaluation.id, evaluation=eval_result(2.0, 4, [1.0]))
    [steps_round] = tm.completed_rounds
    assert (steps_round.trigger, steps_round.model_version) == ("steps", 3)

    tm.observe_model_version(9)
    second = tm.get_task("w")
    assert second.kind is TaskKind.EVALUATE
    tm.report_success(second.id, evaluation=eval_result(2.0, 4, [1.0]))
    assert [r.model_version for r in tm.completed_rounds] == [3, 9]
    # A model version going backwards (a late report) starts nothing.
    tm.observe_model_version(4)
    assert tm.model_version == 9
    assert tm.get_task("w").kind is TaskKind.TRAIN


def test_model_versions_from_success_reports_trigger_evaluation() -> None:
    tm = make(train_shards=[("a", 40)], validation_shards=[("v", 4)], evaluation_steps=5)
    task = tm.get_task("w")
    tm.report_success(task.id, model_version=5)
    assert tm.get_task("w").kind is TaskKind.EVALUATE


def test_without_validation_shards_there_are_no_rounds() -> None:
    tm = make(epochs=2, evaluation_steps=2)
    run_to_end(tm, version_from=0)
    assert tm.model_version == 10  # past several evaluation_steps boundaries
    assert tm.completed_rounds == []
    assert tm.training_done and tm.finished
    assert tm.get_task("w") is None


# -- persistence --


def test_state_round_trip_mid_epoch_continues_with_exact_accounting() -> None:
    clock = FakeClock()
    settings = TaskSettings(
        train_shards=TRAIN,
        validation_shards=VALIDATION,
        records_per_task=4,
        epochs=2,
        lease_s=10.0,
        seed=3,
    )
    tm = TaskManager(settings, clock=clock)
    for version, task in enumerate([tm.get_task("w1") for _ in range(5)], start=1):
        tm.report_success(task.id, model_version=version)
    # Round 0 is pending: one evaluation task reported, one held by w2.
    e1, e2 = tm.get_task("w1"), tm.get_task("w2")
    tm.report_success(e1.id, evaluation=eval_result(1.5, 4, [3.0, 4.0], 2.0))
    # Epoch 2: one task done, one failed once and back in todo, one held by w3.
    done_before = tm.get_task("w1")
    tm.report_success(done_before.id, model_version=6)
    flaky = tm.get_task("w1")
    tm.report_failure(flaky.id, "flaky", "w1")
    held = tm.get_task("w3")
    seen_ids = {t.id for t in (e1, e2, done_before, flaky, held)}

    state = json.loads(json.dumps(tm.to_state()))
    clock.advance(1000)  # every lease of the old master has run out by now
    restored = TaskManager.from_state(settings, state, clock=clock)

    # Tasks in doing keep their worker and get fresh leases.
    assert [t.id for t in restored.tasks_of("w2")] == [e2.id]
    assert [t.id for t in restored.tasks_of("w3")] == [held.id]
    clock.advance(9)
    assert restored.expire_leases() == []
    restored.renew_leases("w2")
    clock.advance(9)
    assert [(t.id, w) for t, w in restored.expire_leases()] == [(held.id, "w3")]
    assert restored.report_success(done_before.id) is None  # already done before the save
    assert restored.records_trained(1) == RECORDS_PER_EPOCH
    assert restored.records_trained(2) == done_before.records
    assert restored.model_version == 6

    # The pending round completes with the partial result saved before the restart.
    restored.report_success(e2.id, evaluation=eval_result(0.5, 2, [1.0, 1.0], 1.0))
    [round_] = restored.completed_rounds
    assert (round_.id, round_.epoch, round_.example_count) == (0, 1, 6)
    assert round_.loss_sum == pytest.approx(2.0)
    np.testing.assert_allclose(round_.metric_states[0], [4.0, 5.0])
    np.testing.assert_allclose(round_.metric_states[1], 3.0)

    rest = run_to_end(restored)
    retried = [t for t in rest if t.id == flaky.id]
    assert len(retried) == 1 and retried[0].failures == 1
    # Epoch 2's other 4 tasks, each once: the expired one, the failed one and two never run.
    trained_after = [t.id for t in rest if t.kind is TaskKind.TRAIN]
    assert len(trained_after) == len(set(trained_after)) == 4
    assert {held.id, flaky.id} <= set(trained_after)
    assert done_before.id not in trained_after
    final_round = [t for t in rest if t.kind is TaskKind.EVALUATE]
    assert len(final_round) == 2
    assert not seen_ids & {t.id for t in final_round}  # new tasks get new ids
    assert restored.epoch_accounting() == [
        {"epoch": 1, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
        {"epoch": 2, "records_trained": RECORDS_PER_EPOCH, "records_expected": RECORDS_PER_EPOCH},
    ]
    assert [(r.id, r.trigger, r.epoch) for r in restored.completed_rounds] == [
        (0, "epoch-end", 1),
        (1, "epoch-end", 2),
    ]
    assert restored.finished


def test_state_round_trip_keeps_a_failure_and_recover_works_on_restored_tasks() -> None:
    tm = make(train_shards=[("a", 4), ("b", 4)], max_task_retries=0)
    held = tm.get_task("w1")
    state = json.loads(json.dumps(tm.to_state()))

    restored = TaskManager.from_state(tm.settings, state, clock=FakeClock())
    assert [t.id for t in restored.recover_tasks("w1")] == [held.id]
    assert restored.get_task("w2").id == held.id

    failing = restored.get_task("w2")
    restored.report_failure(failing.id, "KeyError: 'label'", "w2")
    again = TaskManager.from_state(
        tm.settings, json.loads(json.dumps(restored.to_state())), clock=FakeClock()
    )
    assert again.failure is not None and "KeyError: 'label'" in again.failure
    assert again.get_task("w2") is None
