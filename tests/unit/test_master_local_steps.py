"""The local steps the master chooses (elastic_step/master/tasks/local_steps.py), and what a
training job tells its workers. A resumed job keeps its choice: tests/unit/test_coordinator.py."""

from __future__ import annotations

import pytest
from test_job_kinds import data, training  # noqa: F401 (data is a fixture)

from elastic_step.errors import InputError
from elastic_step.master.config import DEFAULT_LOCAL_STEPS
from elastic_step.master.tasks.local_steps import (
    CHOSEN_BY_MASTER,
    MAX_LOCAL_STEPS,
    PUSHES_PER_WORKER_EPOCH,
    choose_local_steps,
)


def chosen(train_records: int, batch_size: int, workers: int) -> int:
    return choose_local_steps(
        CHOSEN_BY_MASTER, train_records=train_records, batch_size=batch_size, workers=workers
    ).steps


def test_the_master_chooses_by_default() -> None:
    assert DEFAULT_LOCAL_STEPS == CHOSEN_BY_MASTER


@pytest.mark.parametrize(
    ("records", "batch", "workers", "steps"),
    [
        # bench/throughput.py's shape: 383 steps an epoch, one worker.
        (98_000, 256, 1, MAX_LOCAL_STEPS),
        (98_000, 256, 4, 11),
        # bench/quality.py's noisy set: 60 steps an epoch, where K = 16 lost 5 points.
        (960, 16, 2, 3),
        (960, 16, 4, 1),
        # Fewer steps than pushes wanted: every step is pushed.
        (40, 64, 1, 1),
        (0, 64, 2, 1),
    ],
)
def test_each_worker_pushes_enough_times_an_epoch(records, batch, workers, steps) -> None:
    assert chosen(records, batch, workers) == steps
    steps_per_epoch = -(-records // batch)
    if steps > 1:
        assert steps_per_epoch // steps >= PUSHES_PER_WORKER_EPOCH * workers


def test_a_given_number_is_kept_and_the_reason_says_how_it_was_chosen() -> None:
    given = choose_local_steps(16, train_records=960, batch_size=16, workers=4)
    assert (given.steps, given.reason) == (16, "as given by --local-steps")
    auto = choose_local_steps(0, train_records=960, batch_size=16, workers=2)
    assert "60 steps an epoch over 2 workers" in auto.reason
    with pytest.raises(ValueError, match="local steps must be >= 0"):
        choose_local_steps(-1, train_records=960, batch_size=16, workers=2)


def test_a_training_job_tells_its_workers_the_chosen_steps(data, caplog) -> None:  # noqa: F811
    # 40 rows, the default validation split: a few steps an epoch, so every step is pushed.
    with caplog.at_level("INFO", logger="elastic_step.master"):
        assert training(data, workers=2).job_settings().local_steps == 1
    assert "local steps: 1 (chosen by the master" in caplog.text
    # Batches of 1 over the 32 training records: 4 steps a window for one worker; the most
    # workers the job may have count, not those it starts with.
    assert training(data, workers=1, batch_size=1).job_settings().local_steps == 4
    assert training(data, workers=1, max_workers=4, batch_size=1).job_settings().local_steps == 1
    assert training(data, local_steps=5).job_settings().local_steps == 5
    with pytest.raises(InputError, match="--local-steps must be >= 0, got -2"):
        training(data, local_steps=-2)


def test_training_loss_windows_count_pushes_and_stay_few(data) -> None:  # noqa: F811
    # 32 training records in batches of 1: 32 steps an epoch; K = 4 with one worker, so 8
    # pushes (model versions) an epoch, a window of one tenth of them rounded up.
    assert training(data, workers=1, batch_size=1)._train_loss_window() == 1
    assert training(data, workers=1, batch_size=1, local_steps=1)._train_loss_window() == 4
    # 300 epochs of 32 pushes: windows of 96 pushes, 100 in the job, each marked in the chart.
    long = training(data, workers=1, batch_size=1, local_steps=1, epochs=300)
    assert long._train_loss_window() == 96
