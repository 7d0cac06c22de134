"""bench/quality.py's fit trains, seed for seed, the batches of the elastic job's permuted
tasks in the order the master hands them out, so the two sides of the bench differ only by
what elastic-step does differently. tests/e2e/test_quality_bench.py runs the bench."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from quality import fit_batches

from elastic_step.master.tasks.api import TaskKind, TaskSettings
from elastic_step.master.tasks.task_manager import TaskManager
from elastic_step.worker.task_records import split_permutation


def test_fits_batches_are_the_permuted_tasks_of_a_job_of_the_same_seed_in_order() -> None:
    shards, records, batch, epochs, seed = [("a", 21), ("b", 16)], 37, 8, 3, 11
    settings = TaskSettings(
        train_shards=shards, validation_shards=[], records_per_task=batch, epochs=epochs,
        task_timeout_s=10.0, max_task_retries=3, seed=seed, permuted_training_tasks=True,
    )  # fmt: skip
    manager = TaskManager(settings, lease_base=1 << 32, clock=time.monotonic)
    handed_out = []
    while (task := manager.get_task("w")) is not None:
        if task.kind is TaskKind.TRAIN:
            order = split_permutation(seed, task.epoch, records)
            handed_out.append(order[task.start : task.end].tolist())
        manager.report_success(task.id, worker="w", lease_id=task.lease_id)

    fit = [b.tolist() for b in fit_batches(records, seed, epochs, batch).as_numpy_iterator()]
    assert fit == handed_out
    assert [len(b) for b in fit] == [8, 8, 8, 8, 5] * epochs  # the short batch last
    # Each epoch its own permutation of every record; another seed, other batches.
    for epoch in range(epochs):
        trained = [at for positions in fit[epoch * 5 : epoch * 5 + 5] for at in positions]
        assert sorted(trained) == list(range(records))
    assert fit[:5] != fit[5:10]
    other = fit_batches(records, seed + 1, epochs, batch).as_numpy_iterator()
    assert [b.tolist() for b in other] != fit
