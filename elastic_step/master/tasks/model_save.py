"""The training job's last task: a worker writes the trained model.

Once every training task and evaluation round is done, the master asks for the save
(:class:`ModelSave`). The next worker that asks for a task gets it: it pulls the whole model
from the PS (with ``--keep-best``, it reads the kept round's weights file instead) and writes
``model.keras`` and ``saved_model/``, each through an atomic rename, so a second save, or one
after a holder that died midway, writes the same files. The master never builds the full
model: with millions of table rows, the model, the serving layer's lookup tables and Keras's
copies while it writes are more than the master's memory bound, and a worker holds the model
already (bench/README.md, "Where the master's memory goes"). ElasticDL's master hands out a
``SAVE_MODEL`` task for the same reason.

Its lease follows the training tasks' rules (:mod:`.task_manager`): it runs out ``timeout_s``
after the hand-out or after the worker's last progress (its steps: pulled, ``model.keras``,
``saved_model/``), and then goes to the next worker that asks. A worker that reports an error,
or that dies holding it, fails it; past ``max_failures`` failures the job fails. It is not
durable: a master that resumes a job whose tasks are all done asks for the save again. Task
ids of data tasks are never negative, so its id, :data:`SAVE_TASK_ID`, is no other's.
Tests: tests/unit/test_coordinator.py (through the master's service),
tests/e2e/test_fault_tolerance.py (a worker killed while it saves, and a save that fails).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_step.master.tasks.api import TaskSettings
from elastic_step.rpc import master_pb2

log = logging.getLogger("elastic_step.master")

#: The save's task id in a hand-out and a report.
SAVE_TASK_ID = -1


@dataclass
class _Lease:
    worker: str
    lease_id: int
    #: The highest step count the worker reported under it.
    steps: int
    deadline: float


class ModelSave:
    """Who saves the model, and whether it is saved. Not thread-safe: the coordinator's lock
    serializes calls, as it does the task manager's."""

    def __init__(self, weights: str, settings: TaskSettings, clock: Callable[[], float]) -> None:
        """``weights``: the kept round's weights file, or "" for the PS's model; its lease
        and its failures follow ``settings``' (``task_timeout_s``, ``max_task_retries``)."""
        self.weights = weights
        self._timeout_s = settings.task_timeout_s
        self._max_failures = settings.max_task_retries
        self._clock = clock
        self._lease: _Lease | None = None
        #: Set when a worker reported the model saved.
        self.done = False
        #: The causes of failed saves, oldest first.
        self.failures: list[str] = []
        #: Set past ``max_failures`` failures: the job fails with it.
        self.failure: str | None = None

    def next_for(
        self, worker: str, request: master_pb2.NextTaskRequest, lease_id: Callable[[], int]
    ) -> master_pb2.Task | None:
        """What ``worker``, asking for a task with every data task done, gets: the save, if
        nobody holds it (a lease it does not say it holds is taken back first: that answer
        was lost), unless it only reports."""
        self.take_back(worker, keep=request.held_leases)
        return None if request.report_only else self.hand_out(worker, lease_id)

    def hand_out(self, worker: str, lease_id: Callable[[], int]) -> master_pb2.Task | None:
        """The save for ``worker`` under a new lease (``lease_id()`` gives its id); None when
        it is done, failed past its limit, or held by a worker."""
        if self.done or self.failure is not None or self._lease is not None:
            return None
        self._lease = _Lease(worker, lease_id(), 0, self._clock() + self._timeout_s)
        source = f"the weights of {self.weights}" if self.weights else "the PS's parameters"
        log.info("%s saves the model from %s (lease %d)", worker, source, self._lease.lease_id)
        return master_pb2.Task(
            kind=master_pb2.Task.SAVE_MODEL,
            id=SAVE_TASK_ID,
            lease_id=self._lease.lease_id,
            weights=self.weights,
        )

    def holder(self) -> str | None:
        """The worker that holds the save, if any."""
        return self._lease.worker if self._lease else None

    def _holds(self, worker: str, lease_id: int) -> bool:
        lease = self._lease
        return lease is not None and lease.worker == worker and lease.lease_id == lease_id

    def note_progress(self, worker: str, lease_id: int, steps: int) -> None:
        """A heartbeat's progress: more steps done renew the lease."""
        if self._holds(worker, lease_id) and steps > self._lease.steps:
            self._lease.steps = steps
            self._lease.deadline = self._clock() + self._timeout_s

    def report(self, worker: str, report: master_pb2.TaskReport) -> None:
        """Applies ``worker``'s outcome of the save; one on a lease it no longer holds (it
        ran out, or a new master handed the save out again) changes nothing."""
        if not self._holds(worker, report.lease_id):
            log.info(
                "ignored %s's report on the model save (lease %d): it no longer holds it",
                worker,
                report.lease_id,
            )
            return
        self._lease = None
        if report.ok:
            self.done = True
            log.info("%s saved the model", worker)
        else:
            self._fail(worker, report.error)

    def take_back(self, worker: str, *, keep: Sequence[int] = (), death: str | None = None) -> None:
        """Takes the save back from ``worker`` unless it holds it under a lease in ``keep``
        (the lease it says it holds as it asks for a task: any other was never received).
        ``death``: how it ended, when it died by itself holding the save, which counts as a
        failure."""
        lease = self._lease
        if lease is None or lease.worker != worker or lease.lease_id in keep:
            return
        self._lease = None
        if death:
            self._fail(worker, f"{death} while it saved the model")
        else:
            log.info("the model save goes back to the next worker that asks (%s left it)", worker)

    def expire(self) -> None:
        """Takes the save back when its lease ran out."""
        lease = self._lease
        if lease is None or lease.deadline >= self._clock():
            return
        self._lease = None
        log.warning(
            "%s made no progress saving the model for --task-timeout=%.0f s; the save goes to "
            "the next worker that asks",
            lease.worker,
            self._timeout_s,
        )

    def _fail(self, worker: str, cause: str) -> None:
        self.failures.append(cause)
        log.warning(
            "%s failed to save the model (failure %d): %s", worker, len(self.failures), cause
        )
        if len(self.failures) > self._max_failures:
            self.failure = (
                f"cannot save the model: {len(self.failures)} tries failed; the last: {cause}"
            )
