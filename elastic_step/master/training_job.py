"""The training kind of job: epochs of training tasks and evaluation rounds over the PS's
model, ended by saving the model (:mod:`.model_saving`). Tests: tests/unit/test_job_kinds.py,
and every end-to-end training run."""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import shutil
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from elastic_step.data import storage
from elastic_step.master.config import TrainConfig
from elastic_step.master.job_kind import JobKind, RunContext
from elastic_step.master.job_state.api import CoordinatorParams
from elastic_step.master.model_saving import ModelSaver
from elastic_step.master.reporting import reports
from elastic_step.master.tasks import task_size
from elastic_step.master.tasks.api import TaskSettings
from elastic_step.master.tasks.evaluation import metric_values
from elastic_step.master.tasks.local_steps import LocalSteps, choose_local_steps
from elastic_step.model.tf_runtime import set_random_seed
from elastic_step.rpc import master_pb2

if TYPE_CHECKING:
    from elastic_step.data.schema import Schema
    from elastic_step.master.job_state.coordinator import Coordinator
    from elastic_step.master.tracking.recorder import TrackingRecorder
    from elastic_step.model.api import ModelDefinition

log = logging.getLogger("elastic_step.master")

#: The ids of each categorical column in the models the master builds (master_definition).
MASTER_IDS = 1000
#: Training-loss windows per epoch (each spans a fixed number of model versions), and at most
#: this many in a job: the report marks each window of a chart of up to 120 points.
TRAIN_LOSS_WINDOWS_PER_EPOCH = 10
MAX_TRAIN_LOSS_WINDOWS = 100


class TrainingJob(JobKind):
    command = "train"
    results = "model.keras, saved_model/, summary.json and report.html"

    def __init__(self, config: TrainConfig, schema: Schema, definition: ModelDefinition) -> None:
        super().__init__(config, schema, definition)
        self.config: TrainConfig = config
        self._saver = ModelSaver(definition, config)

    @functools.cached_property
    def master_definition(self) -> ModelDefinition:
        """The definition over which the master builds models itself, to check the model
        definition and to resolve its metrics: over the schema with every categorical column
        cut to MASTER_IDS ids besides its out-of-vocabulary ones (``Schema.with_ids_cut``).
        Its models have the job's layers with small tables: a job's vocabularies can hold
        millions of values, and their tables and lookup tables would be most of the master's
        memory. Only --keep-best's rounds, which the master pulls from the PS, build the full
        model."""
        scratch = storage.local_temp_dir("elastic-step-master-schema-")
        atexit.register(shutil.rmtree, scratch, True)
        return self.definition.with_schema(self.schema.with_ids_cut(MASTER_IDS, scratch))

    def fixed_settings(self) -> dict:
        return {**self.config.fixed_settings(), "the model definition": self.definition_digest()}

    def check(self) -> None:
        """--early-stopping and --keep-best name a metric the evaluation reports."""
        names = {"loss", *self.master_definition.build_metrics()}
        if self.config.stopping is not None:
            self.config.stopping.goal.check_known("--early-stopping", names)
        if self.config.best_goal is not None:
            self.config.best_goal.check_known("--keep-best", names)

    @property
    def num_ps(self) -> int:
        return self.config.ps

    def coordinator_params(self) -> CoordinatorParams:
        set_random_seed(self.config.seed)
        metrics = self.master_definition.build_metrics()
        return CoordinatorParams(
            tasks=self._task_settings(metrics),
            membership=self.membership(),
            job_settings=self.job_settings(),
            fixed_settings=self.fixed_settings(),
            evaluate_round=lambda round_: metric_values(metrics, round_),
            early_stopping=self.config.stopping,
            keep_best=self.config.best_goal,
            train_loss_window=self._train_loss_window(),
        )

    def _task_settings(self, metrics: dict) -> TaskSettings:
        c = self.config
        return TaskSettings(
            train_shards=self.schema.shard_paths(c.data, "train"),
            validation_shards=self.schema.shard_paths(c.data, "validation"),
            records_per_task=self.records_per_task,
            epochs=c.epochs,
            evaluation_steps=c.evaluation_steps,
            max_task_retries=c.max_task_retries,
            task_timeout_s=c.task_timeout_s,
            seed=c.seed,
            metric_shapes=tuple(
                tuple(v.shape) for metric in metrics.values() for v in metric.variables
            ),
            # --keep-best saves the model a round measured: the round must measure one.
            pause_training_while_evaluating=c.keep_best is not None,
            permuted_training_tasks=self.permuted_training_tasks,
        )

    @functools.cached_property
    def permuted_training_tasks(self) -> bool:
        """Whether training tasks are ranges of the training split's permutation for their
        epoch (master/tasks/task_size.py): on a small split. Chosen once, and logged."""
        records = self._train_records()
        if records > task_size.PERMUTED_SPLIT_RECORDS:
            return False  # never permuted: no need to ask the store for every shard's size
        shards = self.schema.shard_paths(self.config.data, "train")
        size = sum(storage.size(uri) for uri, _ in shards)
        permuted = task_size.permuted_training_tasks(records, size)
        if permuted:
            log.info(
                "training tasks are permuted: %d training records in %.1f MB of shards (at most "
                "%d and %d MB), so each epoch cuts its tasks from a new permutation of the "
                "whole split, as fit draws its batches; a worker reads the split once and keeps it",
                records, size / 1e6, task_size.PERMUTED_SPLIT_RECORDS,
                task_size.PERMUTED_SPLIT_BYTES >> 20,
            )  # fmt: skip
        else:
            log.info(
                "training tasks are ranges of a shard: the split's %d records take %.1f MB of "
                "shards, more than a worker keeps whole for permuted tasks (%d MB)",
                records, size / 1e6, task_size.PERMUTED_SPLIT_BYTES >> 20,
            )  # fmt: skip
        return permuted

    def _train_records(self) -> int:
        return sum(n for _, n in self.schema.shard_paths(self.config.data, "train"))

    def _train_loss_window(self) -> int:
        """Model versions per training-loss window: about a tenth of an epoch's pushes (a
        push per K steps), and no more than MAX_TRAIN_LOSS_WINDOWS windows in the job."""
        steps = math.ceil(self._train_records() / self.config.batch_size)
        versions = math.ceil(steps / self.local_steps.steps)
        return max(
            1,
            math.ceil(versions / TRAIN_LOSS_WINDOWS_PER_EPOCH),
            math.ceil(versions * self.config.epochs / MAX_TRAIN_LOSS_WINDOWS),
        )

    @functools.cached_property
    def records_per_task(self) -> int:
        """The training tasks' size (master/tasks/task_size.py): chosen once, and logged."""
        c = self.config
        size = task_size.training_records_per_task(
            c.records_per_task,
            train_records=self._train_records(),
            batch_size=c.batch_size,
            local_steps=c.local_steps,
        )
        if c.records_per_task == task_size.CHOSEN_BY_MASTER:
            windows = task_size.window_batches(c.local_steps)
            window = f" or {windows} batches (--local-steps)" if windows > 1 else ""
            log.info(
                "records per task: %d (chosen by the master: %d training records in batches "
                "of %d, so that an epoch has at least %d tasks, each at most %d records%s, "
                "whichever is more; --records-per-task N sets it)",
                size, self._train_records(), c.batch_size, task_size.MIN_TASKS_PER_EPOCH,
                task_size.DEFAULT_RECORDS_PER_TASK, window,
            )  # fmt: skip
        return size

    @functools.cached_property
    def local_steps(self) -> LocalSteps:
        """The steps a worker runs between pushes for this start of the job (a resumed job
        keeps the ones it started with: see ``open_coordinator``); chosen once."""
        c = self.config
        return choose_local_steps(
            c.local_steps,
            train_records=self._train_records(),
            batch_size=c.batch_size,
            workers=max(c.workers, c.max_workers or 0),
        )

    def job_settings(self) -> master_pb2.JobSettings:
        """What every worker and PS is told at Register."""
        c = self.config
        local = self.local_steps
        log.info("local steps: %d (%s)", local.steps, local.reason)
        return master_pb2.JobSettings(
            model_def=self.paths.model_def,
            model_def_sha256=self.definition_digest(),
            data_dir=c.data,
            output_dir=c.output,
            batch_size=c.batch_size,
            num_ps=c.ps,
            seed=c.seed,
            checkpoint_steps=c.checkpoint_steps,
            keep_checkpoints=c.keep_checkpoints,
            staleness_modulation=c.staleness_modulation,
            master_timeout_s=c.master_timeout_s,
            local_steps=local.steps,
            outer_optimizer=c.outer_optimizer,
        )

    def work_due(self, run: RunContext) -> bool:
        best = run.coordinator.best_model_due()
        if best is None:
            return False
        self._saver.save_best(run, best)  # training waits for it
        return True

    def complete(self, run: RunContext) -> bool:
        return self._saver.save_final(run)

    def after_finish(self) -> None:
        """Writes the training's report, report.html, from summary.json."""
        from elastic_step.report import write_report

        try:
            summary = json.loads(storage.read_text(self.paths.summary))
            write_report(evaluation=None, summary=summary, path=self.paths.report)
        except Exception as e:  # the model is saved: a report must not fail the job
            log.warning("cannot write %s: %s: %s", self.paths.report, type(e).__name__, e)

    def start_tracking(self, coordinator: Coordinator) -> TrackingRecorder | None:
        from elastic_step.master.tracking import start_recorder

        c = self.config

        def keep(run_id: str) -> None:
            with coordinator.lock:
                coordinator.record.set_tracking_run(run_id)

        params = {
            name: str(value)
            for name, value in asdict(c).items()
            if isinstance(value, str | int | float | bool)
        }
        return start_recorder(
            tracking_uri=c.mlflow_tracking_uri,
            experiment=c.mlflow_experiment,
            job_name=c.resolved_job_name,
            params=params,
            resume_run_id=coordinator.record.tracking_run_id,
            on_run=keep,
        )

    def tracking_artifacts(self) -> list[tuple[str, str | None]]:
        paths = self.paths
        return [
            (paths.summary, None),
            (paths.report, None),
            (paths.model_file, "model"),
            (paths.saved_model, "model/saved_model"),
        ]

    def place(self, coordinator: Coordinator) -> str:
        return f"epoch {coordinator.tasks.current_epoch}, model v{coordinator.tasks.model_version}"

    def progress_line(self, coordinator: Coordinator) -> str:
        return reports.progress_line(
            coordinator.tasks, coordinator.instances, coordinator.examples_per_second()
        )

    def progress(self, coordinator: Coordinator) -> dict:
        return reports.training_progress(coordinator)

    def summary(self, coordinator: Coordinator) -> dict:
        record, tasks = coordinator.record, coordinator.tasks
        return {
            "phase": record.phase.value,
            "error": record.error,
            # What a reader needs to tell one job's summary (and report) from another's.
            "model_def": self.config.model_def,
            "data": self.config.data,
            "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "epochs": tasks.epoch_accounting(),
            "metrics": record.final_metrics(),
            "evaluations": record.evaluations,
            **reports.run_facts(coordinator),
            "ps_restores": record.ps_restores,
            "model_version": tasks.model_version,
            "train_loss": record.train_loss_windows(),
            "early_stop": record.early_stop,
            "kept_model": reports.kept_model(record),
        }
