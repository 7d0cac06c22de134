"""A :class:`RunTracker` for an MLflow tracking server, with MLflow's own client.

The client retries nothing and waits at most ``REQUEST_TIMEOUT_S`` per request (unless the
user set MLflow's variables): the recorder decides what to retry, and a server that is
away must cost the job nothing. Calls go in batches of MLflow's limits (1,000 metrics, 100
params). The model goes up as files (``model.keras``, the SavedModel directory) under the
run's ``model/``.
Tests: tests/e2e/test_mlflow.py.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from elastic_step.master.tracking.api import (
    MetricPoint,
    RunStatus,
    RunTracker,
    TrackingError,
    TrackingTarget,
)

REQUEST_TIMEOUT_S = 10
METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
#: MLflow's limit on a param's value.
PARAM_CHARS = 6000
#: MLflow's tag for a nested run's parent, which its UI and KFP's plugin read.
PARENT_RUN_TAG = "mlflow.parentRunId"

T = TypeVar("T")


class MlflowRunTracker(RunTracker):
    def __init__(self, target: TrackingTarget) -> None:
        self.target = target
        self._client = None  # made by open(), on the recorder's thread: mlflow loads slowly
        self.run_id: str | None = None
        #: The run as open() found it, when it was not made there.
        self._existing = None
        #: The params the run has; None until read.
        self._params: set[str] | None = None

    def open(self, resume_run_id: str | None) -> str:
        if self._client is None:
            # Read by MLflow's client at each request; a user's own settings win.
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(REQUEST_TIMEOUT_S))
            try:
                from mlflow.tracking import MlflowClient
            except ImportError as e:
                raise TrackingError(f"MLflow's client is not installed ({e})") from None
            self._client = MlflowClient(tracking_uri=self.target.tracking_uri)
        client, target = self._client, self.target
        if target.run_id is not None:
            self._existing = self._call("reading the run", lambda: client.get_run(target.run_id))
            self.run_id = target.run_id
            return self.run_id
        if resume_run_id is not None:
            run = self._call("reading the run", lambda: client.get_run(resume_run_id))
            if run.info.lifecycle_stage != "deleted":
                if run.info.status != "RUNNING":
                    self._call(
                        "resuming the run",
                        lambda: client.update_run(resume_run_id, status="RUNNING"),
                    )
                self._existing = run
                self.run_id = resume_run_id
                return self.run_id
        experiment_id = target.experiment_id or self._experiment(target.experiment_name or "")
        tags = {"elastic_step.job_name": target.run_name}
        if target.parent_run_id:
            tags[PARENT_RUN_TAG] = target.parent_run_id
        run = self._call(
            "making the run",
            lambda: client.create_run(experiment_id, run_name=target.run_name, tags=tags),
        )
        self.run_id = run.info.run_id
        return self.run_id

    def logged_points(self) -> Counter[tuple[str, int, float]]:
        points: Counter[tuple[str, int, float]] = Counter()
        if self._existing is None:
            return points
        client, run_id = self._client, self._run()
        for key in self._existing.data.metrics:
            history = self._call(
                f"reading {key}'s history", lambda k=key: client.get_metric_history(run_id, k)
            )
            points.update((key, p.step, p.value) for p in history)
        return points

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        if self._params is None:
            run = self._call("reading the run", lambda: self._client.get_run(self._run()))
            self._params = set(run.data.params)
        new = [Param(k, str(v)[:PARAM_CHARS]) for k, v in params.items() if k not in self._params]
        for i in range(0, len(new), PARAMS_PER_CALL):
            batch = new[i : i + PARAMS_PER_CALL]
            self._call(
                "logging params", lambda b=batch: self._client.log_batch(self._run(), params=b)
            )
            self._params.update(p.key for p in batch)

    def log_metrics(self, points: Sequence[MetricPoint]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.key, float(p.value), p.timestamp_ms, p.step) for p in points]
        for i in range(0, len(metrics), METRICS_PER_CALL):
            batch = metrics[i : i + METRICS_PER_CALL]
            self._call(
                "logging metrics", lambda b=batch: self._client.log_batch(self._run(), metrics=b)
            )

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        if os.path.isdir(local_path):
            upload = self._client.log_artifacts
        else:
            upload = self._client.log_artifact
        self._call(
            f"uploading {os.path.basename(local_path)}",
            lambda: upload(self._run(), local_path, artifact_path),
        )

    def end(self, status: RunStatus) -> None:
        self._call(
            "ending the run",
            lambda: self._client.set_terminated(
                self._run(), status=status.value, end_time=int(time.time() * 1000)
            ),
        )

    def _run(self) -> str:
        if self.run_id is None:
            raise TrackingError("the run is not open")
        return self.run_id

    def _experiment(self, name: str) -> str:
        client = self._client
        found = self._call("reading the experiment", lambda: client.get_experiment_by_name(name))
        if found is not None:
            return found.experiment_id
        try:
            return self._call("making the experiment", lambda: client.create_experiment(name))
        except TrackingError:  # another job made it meanwhile
            found = self._call(
                "reading the experiment", lambda: client.get_experiment_by_name(name)
            )
            if found is None:
                raise
            return found.experiment_id

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except Exception as e:  # the client raises requests', urllib3's and MLflow's errors
            raise TrackingError(f"{what}: {reason(e)}") from e


def reason(error: BaseException) -> str:
    """A short why: the system's error where there is one ("[Errno 111] Connection refused"),
    else the first line of the message."""
    text = str(error)
    found = re.search(r"\[Errno -?\d+\][^'\")\]]*", text)
    if found:
        return found.group(0).strip()
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first[:200]}"
