"""A prediction job on the training engine: the same master, coordinator, backends, leases,
journal and restarts, with prediction tasks and no PS.

The input's records are cut into tasks as one epoch of training data is (``TaskKind.PREDICT``,
no validation split). Each worker loads the trained model once and writes each task's part
(:mod:`elastic_step.worker.predictor`); the master merges the parts into ``predictions.csv``
once every task is done (:mod:`elastic_step.predict_output`). A task counts once, however
often it ran, and its part is written whole or not at all, so the file holds one prediction
per input row whatever workers die. A resumed job keeps the tasks done before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging

from elastic_step.data import storage
from elastic_step.data.schema import Schema
from elastic_step.master.config import TrainConfig
from elastic_step.master.instance_manager import MembershipSettings
from elastic_step.master.job import Job
from elastic_step.master.task_manager import TaskKind, TaskSettings
from elastic_step.model_def import ModelDefinition
from elastic_step.output_layout import OutputLayout
from elastic_step.predict_output import merge_parts
from elastic_step.rpc import master_pb2

log = logging.getLogger("elastic_step.master")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PredictInput:
    """What a prediction job reads: the model's directory and the records to predict."""

    #: The --output of a finished training.
    model_dir: str
    #: (shard URI, records) of the records, in input order.
    shards: tuple[tuple[str, int], ...]
    #: Says what the input was, for a resumed job's settings check (the CSV or DIR:SPLIT).
    source: str


class PredictJob(Job):
    RESULTS = "predictions.csv and summary.json"

    def __init__(
        self,
        config: TrainConfig,
        schema: Schema,
        definition: ModelDefinition,
        given: PredictInput,
        backend_options: object = None,
    ) -> None:
        """``config``: the engine's settings (workers, backend, timeouts, task size, batch
        size, output); its training-only settings are not used."""
        super().__init__(config, schema, definition, backend_options=backend_options)
        self.given = given

    def fixed_settings(self) -> dict:
        model = OutputLayout(self.given.model_dir)
        return {
            "the command": "predict",
            "--input": self.given.source,
            "--batch-size": self.config.batch_size,
            "--records-per-task": self.config.records_per_task,
            "the model": hashlib.sha256(storage.read_bytes(model.model_file)).hexdigest(),
            "the model definition": hashlib.sha256(self.definition.source.encode()).hexdigest(),
        }

    def _task_settings(self) -> TaskSettings:
        c = self.config
        return TaskSettings(
            train_shards=self.given.shards,
            validation_shards=(),
            records_per_task=c.records_per_task,
            epochs=1,
            max_task_retries=c.max_task_retries,
            task_timeout_s=c.task_timeout_s,
            seed=c.seed,
            task_kind=TaskKind.PREDICT,
        )

    def _membership_settings(self) -> MembershipSettings:
        return dataclasses.replace(super()._membership_settings(), num_ps=0)

    def _train_loss_window(self) -> int:
        return 1  # no training

    def job_settings(self) -> master_pb2.JobSettings:
        settings = super().job_settings()
        settings.num_ps = 0
        settings.data_dir = self.given.model_dir  # the model's schema.json: the feed's
        settings.predict_model_dir = self.given.model_dir
        settings.predict_parts_dir = self.paths.prediction_parts
        return settings

    def _build(self, saved, record, token: int) -> None:
        super()._build(saved, record, token)
        storage.makedirs(self.paths.prediction_parts)

    def _save_final_model(self) -> bool:
        """Merges the parts into predictions.csv (every task is done)."""
        with self.coordinator.lock:
            tasks = [
                (t.id, t.first_index, t.records) for t in self.coordinator.tasks.epoch_tasks(1)
            ]
        rows = merge_parts(self.paths.prediction_parts, tasks, self.paths.predictions)
        log.info("wrote %d predictions to %s", rows, self.paths.predictions)
        return True

    def _finish(self) -> int:
        status = super()._finish()
        # Once every worker is gone: none can write a part after this.
        storage.remove(self.paths.prediction_parts)
        return status

    def _write_summary(self) -> None:
        from elastic_step.master import reports

        coordinator = self.coordinator
        with coordinator.lock:
            record, tasks = coordinator.record, coordinator.tasks
            document = {
                "phase": record.phase.value,
                "error": record.error,
                "input": self.given.source,
                "records": tasks.records_per_epoch,
                "records_predicted": tasks.records_trained(1),
                "predictions": self.paths.predictions,
                **self._run_facts(),
            }
        reports.write_json(self.paths.summary, document)
