"""The phases of a job, as the master records them.
Tests: tests/unit/test_coordinator.py, tests/unit/test_job_record.py, and
tests/e2e/test_hardening.py (an interrupted job relaunches every slot)."""

from __future__ import annotations

import enum


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
