"""What the job-state room shares with the rest of the master: the phases of a job, what a
coordinator is built from, and the error for a caller that is not who it claims. The
coordinator (:mod:`.coordinator`) holds the state and decides, behind one lock.
Tests: tests/unit/test_coordinator.py, tests/unit/test_job_record.py, and
tests/e2e/test_hardening.py (an interrupted job relaunches every slot)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from elastic_step.master.instances.api import MembershipSettings
from elastic_step.master.saving.api import EarlyStopping, MetricGoal
from elastic_step.master.tasks.api import EvaluationRound, TaskSettings
from elastic_step.rpc import master_pb2


class Phase(enum.StrEnum):
    #: Created or resumed: adopting live instances and launching the missing ones.
    STARTING = "starting"
    #: Workers train and evaluate; the model is saved once every epoch is done.
    RUNNING = "running"
    #: The model is saved: instances are told to exit.
    SUCCEEDED = "succeeded"
    #: A task or the membership failed past its limits: the job cannot go on.
    FAILED = "failed"
    #: Stopped by SIGTERM or SIGINT: running the same command again resumes it.
    INTERRUPTED = "interrupted"

    @property
    def over(self) -> bool:
        """No task is handed out any more."""
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.INTERRUPTED)

    @property
    def dismisses_instances(self) -> bool:
        """Workers and PS are told to exit by themselves.

        Not so for an interrupted job: its instances are deleted, and must not exit 0 and
        be taken for finished, so that a resumed job relaunches every slot.
        """
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class CallerError(Exception):
    """A call from a process that is not the instance it claims, or not of this job."""


@dataclass(frozen=True)
class CoordinatorParams:
    """What a job's coordinator is built from, besides its store and backend."""

    tasks: TaskSettings
    membership: MembershipSettings
    #: What every worker and PS is told at Register.
    job_settings: master_pb2.JobSettings
    #: The settings a resumed job must share (see :meth:`JobRecord.differing_settings`).
    fixed_settings: dict
    #: An evaluation round's metric values from its summed states.
    evaluate_round: Callable[[EvaluationRound], dict]
    early_stopping: EarlyStopping | None = None
    keep_best: MetricGoal | None = None
    #: Training losses are averaged over windows of this many model versions.
    train_loss_window: int = 100
