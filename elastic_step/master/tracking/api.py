"""Experiment tracking: one run on a tracking server that a training job logs to, besides
what it writes under ``--output``.

A :class:`RunTracker` speaks to one server for one run. The master's
:class:`~elastic_step.master.tracking.recorder.TrackingRecorder` calls it from a thread of its own,
so a slow or absent server never holds the job; every call may raise :class:`TrackingError`,
and the recorder decides what to retry. Where the run is comes from a
:class:`TrackingTarget` (:mod:`elastic_step.master.tracking.target` reads it from the flags and the
environment, KFP's MLflow variables included).
Tests: tests/unit/test_tracking.py, tests/e2e/test_mlflow.py.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


class TrackingError(Exception):
    """A call to the tracking server failed; the message says which call and why."""


class RunStatus(enum.Enum):
    """How a run ends: MLflow's terminal run statuses."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


@dataclass(frozen=True, kw_only=True)
class TrackingTarget:
    """Where a job's run is, and whose it is to end."""

    tracking_uri: str
    #: Log into this run, which exists (KFP's nested run of the task); None: make one, or
    #: resume the one the job made before a master restart.
    run_id: str | None = None
    #: The experiment of a run made here: by id, or else by name (made when missing).
    experiment_id: str | None = None
    experiment_name: str | None = None
    #: Nest a run made here under this run (KFP's run of the whole pipeline run).
    parent_run_id: str | None = None
    #: The name of a run made here: the job's name.
    run_name: str
    #: Whether the job ends the run: not when the platform that made it ends it.
    owns_run: bool
    #: What named the target, for the log ("MLFLOW_RUN_ID", "--mlflow-tracking-uri", ...).
    source: str


@dataclass(frozen=True)
class MetricPoint:
    key: str
    value: float
    #: The model version the value belongs to.
    step: int
    #: When it was measured, in milliseconds since the epoch.
    timestamp_ms: int


class RunTracker(ABC):
    """One run on one tracking server. Not thread-safe: one thread calls it."""

    @abstractmethod
    def open(self, resume_run_id: str | None) -> str:
        """Opens the run and returns its id: the target's run, else ``resume_run_id`` (the
        run this job made before its master restarted) marked running again, else a new
        run. Raises TrackingError."""

    @abstractmethod
    def logged_points(self) -> Counter[tuple[str, int, float]]:
        """The points the run has, as (key, step, value), each with how often: what a
        restarted master need not send again (empty for a run made by :meth:`open`)."""

    @abstractmethod
    def log_params(self, params: dict[str, str]) -> None:
        """Logs the params the run does not have yet; one it has keeps its value (a resumed
        job's are its first run's)."""

    @abstractmethod
    def log_metrics(self, points: Sequence[MetricPoint]) -> None:
        """Logs ``points``, in as few calls as the server allows."""

    @abstractmethod
    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Uploads a file, or a directory's files, under ``artifact_path`` of the run."""

    @abstractmethod
    def end(self, status: RunStatus) -> None:
        """Ends the run with ``status``."""
