"""What a kind of job computes, apart from how the master runs it (:mod:`.job`).

A :class:`JobKind` turns its settings into the coordinator's (tasks, members, what workers
are told), says what a resumed job must share with the saved one, and does the work that
ends the job: the training kind saves the model (:mod:`.training_job`), the prediction kind
merges the predictions (:mod:`.prediction_job`). Tests: tests/unit/test_job_kinds.py, and
every end-to-end run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from elastic_step.data import storage
from elastic_step.master.config import EngineConfig
from elastic_step.master.instances.api import MembershipSettings
from elastic_step.master.saving.output_owner import OutputOwner, claim_output
from elastic_step.model.definition import changed_since, source_digest
from elastic_step.output_layout import OutputLayout

if TYPE_CHECKING:
    from elastic_step.data.schema import Schema
    from elastic_step.master.job_state.api import CoordinatorParams
    from elastic_step.master.job_state.coordinator import Coordinator
    from elastic_step.master.state_store import StateStore
    from elastic_step.master.tracking.recorder import TrackingRecorder
    from elastic_step.model.api import ModelDefinition
    from elastic_step.rpc import auth


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What a running job gives its kind's end-of-job work."""

    coordinator: Coordinator
    store: StateStore
    #: The master's, for its calls to the PS.
    credentials: auth.Credentials
    paths: OutputLayout


class JobKind(ABC):
    """One kind of job: its settings, its tasks and the work that ends it."""

    #: The command that runs it, as the job record keeps it.
    command: ClassVar[str]
    #: What the job leaves in --output, for its last log line.
    results: ClassVar[str]

    def __init__(self, config: EngineConfig, schema: Schema, definition: ModelDefinition) -> None:
        self.config = config
        self.schema = schema
        self.definition = definition
        self.paths = OutputLayout(config.output)

    def claim_output(self, state: str, token: int, master: str) -> None:
        """Claims --output for this job, whose state is in ``state`` (see
        :mod:`.output_owner`); OutputTakenError when it belongs to another job."""
        owner = OutputOwner(
            job=self.config.resolved_job_name,
            state=state,
            command=self.command,
            token=token,
            master=master,
        )
        claim_output(self.config.output, owner)

    def definition_digest(self) -> str:
        return source_digest(self.definition.source)

    def input_problem(self) -> str | None:
        """Why the job's processes refuse their input, as far as the master can tell: the
        copy of the model definition in --output changed since the job started. Called when
        a worker or PS exited with status 2 (bad input)."""
        path = self.paths.model_def
        try:
            actual = source_digest(storage.read_text(path))
        except (OSError, UnicodeDecodeError) as e:
            return f"the model definition {path} cannot be read any more: {e}"
        expected = self.definition_digest()
        if actual == expected:
            return None
        return f"the model definition {path}: {changed_since(actual, expected)}"

    @abstractmethod
    def fixed_settings(self) -> dict:
        """What a resumed or re-run job must share with the saved one, by flag."""

    def check(self) -> None:
        """Refuses settings that cannot work, before anything is written or started."""
        return None

    @property
    def num_ps(self) -> int:
        return 0

    def members_text(self) -> str:
        """The instances it starts with, for the log: "1 PS and 2 workers", "2 workers"."""
        workers = f"{self.config.workers} workers"
        return f"{self.num_ps} PS and {workers}" if self.num_ps else workers

    @property
    def members(self) -> str:
        """What its instances are, for the log: "workers and PS", or "workers"."""
        return "workers and PS" if self.num_ps else "workers"

    def membership(self) -> MembershipSettings:
        c = self.config
        return MembershipSettings(
            workers=c.workers,
            min_workers=c.min_workers,
            max_workers=c.worker_limit,
            num_ps=self.num_ps,
            max_restarts=c.max_restarts,
            grow_after_s=c.grow_after_s,
            sizing="throughput" if c.auto_workers else "all-running",
            min_gain=c.auto_workers_gain,
            starve_timeout_s=c.master_timeout_s,
            standby=c.standby,
        )

    @abstractmethod
    def coordinator_params(self) -> CoordinatorParams:
        """The coordinator's settings; called once per master, before any task is given."""

    def prepare_output(self, *, new: bool) -> None:
        """Writes what --output holds before any task runs: for a new job, copies of the
        model definition and of the data's schema and vocabularies (what `evaluate` and
        `predict` read)."""
        if new:
            storage.write_text_atomic(self.paths.model_def, self.definition.source)
            self.schema.copy_to(self.paths.root)

    def work_due(self, run: RunContext) -> bool:
        """Does work that the job waits for while it runs (none by default); True when it
        did some this tick."""
        return False

    @abstractmethod
    def complete(self, run: RunContext) -> bool:
        """The work that ends the job once every task is done; False: not yet (the loop
        calls it again)."""

    @abstractmethod
    def place(self, coordinator: Coordinator) -> str:
        """Where the job stands, in words for the log ("epoch 2, model v40")."""

    @abstractmethod
    def progress_line(self, coordinator: Coordinator) -> str:
        """The log's progress line; called under the coordinator's lock."""

    @abstractmethod
    def progress(self, coordinator: Coordinator) -> dict:
        """status.json's fields that say where the job is; called under the coordinator's
        lock."""

    @abstractmethod
    def summary(self, coordinator: Coordinator) -> dict:
        """summary.json's document; called under the coordinator's lock."""

    def after_finish(self) -> None:
        """Cleans up, and writes what the job leaves besides its results, once every worker
        and PS is gone."""
        return None

    def start_tracking(self, coordinator: Coordinator) -> TrackingRecorder | None:
        """The job's experiment tracking, started; None for none (the default)."""
        return None

    def tracking_artifacts(self) -> list[tuple[str, str | None]]:
        """What the job's tracking run keeps at the end: (path under --output, the
        artifact path to put it under)."""
        return []
