"""The prediction kind of job: the same master, coordinator, backends, leases, journal and
restarts as training, with prediction tasks and no PS.

The input's records are cut into tasks as one epoch of training data is (``TaskKind.PREDICT``,
no validation split). Each worker loads the trained model once and writes each task's part
(:mod:`elastic_step.worker.predictor`); the master merges the parts into ``predictions.csv``
once every task is done (:mod:`elastic_step.data.predict_output`). A task counts once, however
often it ran, and its part is written whole or not at all, so the file holds one prediction
per input row whatever workers die. A resumed job keeps the tasks done before.
Tests: tests/e2e/test_predict.py, tests/unit/test_job_kinds.py.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING

from elastic_step.data import storage
from elastic_step.data.predict_output import merge_parts
from elastic_step.master.config import PredictConfig
from elastic_step.master.job_kind import JobKind, RunContext
from elastic_step.master.job_state.api import CoordinatorParams
from elastic_step.master.reporting import reports
from elastic_step.master.tasks import task_size
from elastic_step.master.tasks.api import TaskKind, TaskSettings
from elastic_step.output_layout import OutputLayout
from elastic_step.rpc import master_pb2

if TYPE_CHECKING:
    from elastic_step.data.schema import Schema
    from elastic_step.master.job_state.coordinator import Coordinator
    from elastic_step.model.api import ModelDefinition

log = logging.getLogger("elastic_step.master")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PredictInput:
    """The records to predict, once the input is read (a CSV encoded, or a split chosen)."""

    #: (shard URI, records) of the records, in input order.
    shards: tuple[tuple[str, int], ...]
    #: Says what the input was, for a resumed job's settings check (the CSV or DIR:SPLIT).
    source: str


class PredictionJob(JobKind):
    command = "predict"
    results = "predictions.csv and summary.json"

    def __init__(
        self,
        config: PredictConfig,
        schema: Schema,
        definition: ModelDefinition,
        *,
        given: PredictInput,
    ) -> None:
        super().__init__(config, schema, definition)
        self.config: PredictConfig = config
        self.given = given

    @functools.cached_property
    def _model_digest(self) -> str:
        # Read once: the settings are asked for twice a run (the resume check, the
        # coordinator), and model.keras may be large and in an object store.
        model = OutputLayout(self.config.model_dir)
        return storage.sha256_of(model.model_file)

    def fixed_settings(self) -> dict:
        return {
            "the command": self.command,
            "--input": self.given.source,
            "--batch-size": self.config.batch_size,
            "--records-per-task": self.config.records_per_task,
            "the model": self._model_digest,
            "the model definition": self.definition_digest(),
        }

    def coordinator_params(self) -> CoordinatorParams:
        c = self.config
        return CoordinatorParams(
            tasks=TaskSettings(
                train_shards=self.given.shards,
                validation_shards=(),
                records_per_task=task_size.prediction_records_per_task(c.records_per_task),
                epochs=1,
                max_task_retries=c.max_task_retries,
                task_timeout_s=c.task_timeout_s,
                seed=c.seed,
                task_kind=TaskKind.PREDICT,
            ),
            membership=self.membership(),
            job_settings=self.job_settings(),
            fixed_settings=self.fixed_settings(),
            evaluate_round=lambda round_: {},  # a prediction job has no evaluation rounds
            train_loss_window=1,
        )

    def job_settings(self) -> master_pb2.JobSettings:
        """What every worker is told at Register."""
        c = self.config
        return master_pb2.JobSettings(
            model_def=self.paths.model_def,
            model_def_sha256=self.definition_digest(),
            data_dir=c.model_dir,  # the model's schema.json: the feed's
            output_dir=c.output,
            batch_size=c.batch_size,
            seed=c.seed,
            master_timeout_s=c.master_timeout_s,
            predict_model_dir=c.model_dir,
            predict_parts_dir=self.paths.prediction_parts,
        )

    def prepare_output(self, *, new: bool) -> None:
        super().prepare_output(new=new)
        storage.makedirs(self.paths.prediction_parts)

    def complete(self, run: RunContext) -> bool:
        """Merges the parts into predictions.csv (every task is done)."""
        with run.coordinator.lock:
            tasks = [(t.id, t.first_index, t.records) for t in run.coordinator.tasks.epoch_tasks(1)]
        rows = merge_parts(self.paths.prediction_parts, tasks, self.paths.predictions)
        log.info("wrote %d predictions to %s", rows, self.paths.predictions)
        return True

    def after_finish(self) -> None:
        # Once every worker is gone: none can write a part after this.
        storage.remove(self.paths.prediction_parts)

    def place(self, coordinator: Coordinator) -> str:
        tasks = coordinator.tasks
        return f"{tasks.records_trained(1)}/{tasks.records_per_epoch} records predicted"

    def progress_line(self, coordinator: Coordinator) -> str:
        return reports.prediction_progress_line(
            coordinator.tasks, coordinator.instances, coordinator.examples_per_second()
        )

    def progress(self, coordinator: Coordinator) -> dict:
        return reports.prediction_progress(coordinator)

    def summary(self, coordinator: Coordinator) -> dict:
        record, tasks = coordinator.record, coordinator.tasks
        return {
            "phase": record.phase.value,
            "error": record.error,
            "input": self.given.source,
            "records": tasks.records_per_epoch,
            "records_predicted": tasks.records_trained(1),
            "predictions": self.paths.predictions,
            **reports.run_facts(coordinator),
        }
