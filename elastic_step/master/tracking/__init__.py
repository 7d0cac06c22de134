"""Experiment tracking: a training job's params, metrics, artifacts and model in an MLflow
run (see :mod:`.api`, :mod:`.target`, :mod:`.recorder`). Tests: tests/unit/test_tracking.py,
tests/e2e/test_mlflow.py.

May import: reporting.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from elastic_step.master.tracking.mlflow_tracker import MlflowRunTracker
from elastic_step.master.tracking.recorder import TrackingRecorder
from elastic_step.master.tracking.target import tracking_target

log = logging.getLogger("elastic_step.master")


def start_recorder(
    *,
    tracking_uri: str | None,
    experiment: str | None,
    job_name: str,
    params: dict[str, str],
    resume_run_id: str | None,
    on_run: Callable[[str], None],
) -> TrackingRecorder | None:
    """The job's MLflow logging, started; None when the flags and the environment name no
    tracking server (see :mod:`.target`)."""
    target = tracking_target(
        tracking_uri=tracking_uri, experiment=experiment, job_name=job_name, environ=os.environ
    )
    if target is None:
        return None
    where = f"{target.tracking_uri} (from {target.source})"
    log.info(
        "MLflow: logging to %s; %s",
        where,
        f"into run {target.run_id}, which its maker ends"
        if target.run_id
        else f"a run named {target.run_name}"
        + (f", nested under {target.parent_run_id}" if target.parent_run_id else ""),
    )
    recorder = TrackingRecorder(
        MlflowRunTracker(target),
        where=where,
        params=params,
        resume_run_id=None if target.run_id else resume_run_id,
        on_run=on_run,
        owns_run=target.owns_run,
    )
    recorder.start()
    return recorder
