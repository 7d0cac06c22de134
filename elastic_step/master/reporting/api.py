"""The reporting room's interface: a copy of what the master shows about a running job,
taken under the coordinator's lock.

status.json, the TensorBoard events and the Prometheus endpoint all read one, so they
agree and none of them holds the lock while it writes or serves.
Tests: tests/unit/test_watching_master.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_step.backends.api import Role
from elastic_step.master.instances.process_state import ProcessState

if TYPE_CHECKING:
    from elastic_step.master.job_state.coordinator import Coordinator


@dataclass(frozen=True, kw_only=True)
class JobView:
    phase: str
    #: The oldest epoch not fully trained, and the last epoch the job runs.
    epoch: int
    last_epoch: int
    model_version: int
    #: Tasks by kind ("train", "evaluate") and state ("todo", "doing", "done").
    tasks: dict[str, dict[str, int]]
    #: Live instances by role ("worker", "ps") and state ("pending", "running").
    instances: dict[str, dict[str, int]]
    #: Worker and PS restarts by how the replaced instance ended.
    restarts_by_reason: dict[str, int]
    master_restarts: int
    examples_per_second: float | None
    elapsed_s: float
    eta_s: float | None
    #: Every evaluation entry, in epoch order (see JobRecord.evaluations).
    evaluations: tuple[dict, ...]
    #: Training-loss windows, oldest first (see JobRecord.train_loss_windows).
    train_loss: tuple[dict, ...]
    #: The first window a training task still out can report into: the windows before it
    #: are final (see TaskManager.lowest_report_version); None: no training task is out.
    first_open_window: int | None = None

    @classmethod
    def of(cls, coordinator: Coordinator) -> JobView:
        """Call under the coordinator's lock."""
        tasks, instances, record = coordinator.tasks, coordinator.instances, coordinator.record
        counts = {
            role.value: {state.value: 0 for state in (ProcessState.PENDING, ProcessState.RUNNING)}
            for role in Role
        }
        for role in Role:
            for instance in instances.live(role):
                counts[role.value][instance.state.value] += 1
        lowest = tasks.lowest_report_version
        return cls(
            phase=record.phase.value,
            epoch=tasks.current_epoch,
            last_epoch=tasks.last_epoch,
            model_version=tasks.model_version,
            tasks=tasks.task_counts(),
            instances=counts,
            restarts_by_reason=dict(instances.restarts_by_reason),
            master_restarts=record.master_restarts,
            examples_per_second=coordinator.examples_per_second(),
            elapsed_s=instances.elapsed_s(),
            eta_s=coordinator.eta_s(),
            evaluations=tuple(record.evaluations),
            train_loss=tuple(record.train_loss_windows()),
            first_open_window=None if lowest is None else lowest // coordinator.train_loss_window,
        )

    @property
    def latest_evaluation(self) -> dict | None:
        """The round started last among those evaluated."""
        return max(self.evaluations, key=lambda e: e["round"], default=None)

    @property
    def live_workers(self) -> int:
        return self.instances[Role.WORKER.value][ProcessState.RUNNING.value]


def scalar_metrics(evaluation: dict) -> dict[str, float]:
    """An evaluation's (or a window's) metrics that are one number, by name."""
    return {
        name: float(value)
        for name, value in evaluation.get("metrics", {}).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }
