"""The training tasks' size the master chooses (elastic_step/master/tasks/task_size.py), and the
tasks a training and a prediction job make with it."""

from __future__ import annotations

import pytest
from test_job_kinds import data, prediction, training  # noqa: F401 (data is a fixture)

from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig
from elastic_step.master.tasks.task_size import (
    CHOSEN_BY_MASTER,
    DEFAULT_RECORDS_PER_TASK,
    MIN_TASKS_PER_EPOCH,
    PERMUTED_SPLIT_BYTES,
    PERMUTED_SPLIT_RECORDS,
    permuted_training_tasks,
    training_records_per_task,
)


@pytest.mark.parametrize(
    ("records", "batch", "local_steps", "size"),
    [
        # bench/quality.py's diabetes: 354 records in batches of 16. Two shard-long tasks an
        # epoch made the last one decide the validation loss; one batch a task now.
        (354, 16, 0, 16),
        # digits in batches of 32: a batch a task (45 tasks); two would make 23.
        (1_437, 32, 0, 32),
        (4 * 32 * MIN_TASKS_PER_EPOCH, 32, 0, 4 * 32),
        # Large sets keep the default size where the master chooses the local steps.
        (36_000, 64, 0, DEFAULT_RECORDS_PER_TASK),
        (98_000, 256, 0, DEFAULT_RECORDS_PER_TASK),
        (800_000, 512, 0, 512),
        # Local steps K > 1 given: 16 batches, or K if more (data allowing), or the default
        # size if that is more. bench/scale.py's CTR job: tasks of one batch made windows of
        # one step, and each task's first window pulls on its own.
        (800_000, 512, 4, 16 * 512),
        (98_000, 256, 16, 11 * 256),
        (800_000, 512, 1, 512),
        (800_000, 512, 32, 32 * 512),
        (800_000, 16, 4, DEFAULT_RECORDS_PER_TASK),
        (800_000, 64, 4, 16 * 64),
        # Batches larger than the default size: one a task at the least.
        (800_000, 1024, 1, 1024),
        # Fewer records than a batch: one batch a task, whatever the epoch.
        (10, 64, 0, 64),
        (0, 64, 0, 64),
    ],
)
def test_an_epoch_has_enough_tasks_of_whole_batches(
    records: int, batch: int, local_steps: int, size: int
) -> None:
    chosen = training_records_per_task(
        CHOSEN_BY_MASTER, train_records=records, batch_size=batch, local_steps=local_steps
    )
    assert chosen == size
    assert chosen % batch == 0
    if chosen > batch:
        assert records // chosen >= MIN_TASKS_PER_EPOCH


def test_a_given_size_is_kept_and_a_negative_one_refused() -> None:
    assert training_records_per_task(100, train_records=354, batch_size=16) == 100
    with pytest.raises(ValueError, match="records per task must be >= 0"):
        training_records_per_task(-1, train_records=354, batch_size=16)
    with pytest.raises(InputError, match="--records-per-task must be >= 0, got -3"):
        TrainConfig(model_def="m.py", data="d", output="o", records_per_task=-3)


def test_jobs_make_their_tasks_with_it(data, caplog) -> None:  # noqa: F811
    # 32 training records in batches of 1: one record a task makes 32 tasks an epoch.
    with caplog.at_level("INFO", logger="elastic_step.master"):
        job = training(data, batch_size=1)
        assert job.coordinator_params().tasks.records_per_task == 1
    assert "records per task: 1 (chosen by the master: 32 training records" in caplog.text
    assert training(data).coordinator_params().tasks.records_per_task == 64
    assert training(data, records_per_task=5).coordinator_params().tasks.records_per_task == 5
    # The choice is for training; a prediction's tasks take the default size.
    for given, size in ((0, DEFAULT_RECORDS_PER_TASK), (7, 7)):
        job = prediction(data, records_per_task=given)
        job.__dict__["_model_digest"] = "0" * 64  # a cached property: no model file here
        assert job.coordinator_params().tasks.records_per_task == size


def test_small_training_splits_get_permuted_tasks(data, caplog) -> None:  # noqa: F811
    # The splits on which the master's tasks are smaller than the default size (diabetes,
    # digits, up to 32 tasks of 512 records), if a worker can keep them whole.
    assert PERMUTED_SPLIT_RECORDS == MIN_TASKS_PER_EPOCH * DEFAULT_RECORDS_PER_TASK == 16_384
    small, most = 10 << 20, PERMUTED_SPLIT_BYTES
    assert all(permuted_training_tasks(n, small) for n in (1, 354, 1_437, 16_384))
    assert permuted_training_tasks(16_384, most) and not permuted_training_tasks(354, most + 1)
    assert not any(permuted_training_tasks(n, small) for n in (16_385, 32_000, 800_000))
    with caplog.at_level("INFO", logger="elastic_step.master"):
        assert training(data).coordinator_params().tasks.permuted_training_tasks
    assert "training tasks are permuted: 32 training records in 0.0 MB" in caplog.text
    job = prediction(data)
    job.__dict__["_model_digest"] = "0" * 64
    assert not job.coordinator_params().tasks.permuted_training_tasks
