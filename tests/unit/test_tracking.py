"""Where a job's MLflow run is (flags, MLflow's and KFP's variables, in that order of say),
the short reasons the master logs when a server is away, and the recorder's count of what a
resumed run already has. The runs themselves, against a
real server: tests/e2e/test_mlflow.py and tests/e2e/test_mlflow_kfp_local.py."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest

from elastic_step.master.tracking.api import MetricPoint, RunStatus, RunTracker, TrackingError
from elastic_step.master.tracking.mlflow_tracker import reason
from elastic_step.master.tracking.recorder import TrackingRecorder
from elastic_step.master.tracking.target import DEFAULT_EXPERIMENT, tracking_target

KFP = {
    "endpoint": "http://mlflow.kubeflow:5000",
    "experimentId": "7",
    "parentRunId": "parent",
    "authType": "none",
    "timeout": "30s",
}


def target(environ: dict, uri: str | None = None, experiment: str | None = None):
    return tracking_target(
        tracking_uri=uri, experiment=experiment, job_name="es-job", environ=environ
    )


def test_nothing_set_means_no_tracking() -> None:
    assert target({}) is None


def test_the_flag_or_mlflow_s_variable_makes_a_run_named_by_the_job() -> None:
    flag = target({}, uri="http://a:5000")
    assert (flag.tracking_uri, flag.experiment_name, flag.experiment_id) == (
        "http://a:5000",
        DEFAULT_EXPERIMENT,
        None,
    )
    assert flag.run_name == "es-job" and flag.owns_run and flag.run_id is None
    assert flag.source == "--mlflow-tracking-uri"
    env = target({"MLFLOW_TRACKING_URI": "http://b", "MLFLOW_EXPERIMENT_NAME": "mine"})
    assert (env.tracking_uri, env.experiment_name, env.source) == (
        "http://b",
        "mine",
        "MLFLOW_TRACKING_URI",
    )
    by_id = target({"MLFLOW_TRACKING_URI": "http://b", "MLFLOW_EXPERIMENT_ID": "3"})
    assert (by_id.experiment_id, by_id.experiment_name) == ("3", None)
    # The flag wins over the variables, the experiment's too.
    both = target(
        {"MLFLOW_TRACKING_URI": "http://b", "MLFLOW_EXPERIMENT_ID": "3"},
        uri="http://a",
        experiment="flagged",
    )
    assert (both.tracking_uri, both.experiment_id, both.experiment_name) == (
        "http://a",
        None,
        "flagged",
    )


def test_kfp_s_config_nests_a_run_the_job_ends() -> None:
    nested = target({"KFP_MLFLOW_CONFIG": json.dumps(KFP)})
    assert (nested.tracking_uri, nested.experiment_id, nested.parent_run_id) == (
        "http://mlflow.kubeflow:5000",
        "7",
        "parent",
    )
    assert nested.owns_run and nested.run_id is None and nested.source == "KFP_MLFLOW_CONFIG"


def test_kfp_s_injected_run_is_logged_into_and_left_to_kfp_to_end() -> None:
    injected = target(
        {
            "KFP_MLFLOW_CONFIG": json.dumps({**KFP, "injectUserEnvVars": True}),
            "MLFLOW_RUN_ID": "task-run",
            "MLFLOW_TRACKING_URI": "http://mlflow.kubeflow:5000",
            "MLFLOW_EXPERIMENT_ID": "7",
        }
    )
    assert injected.run_id == "task-run" and not injected.owns_run
    assert injected.tracking_uri == "http://mlflow.kubeflow:5000"
    # The run's server may come from KFP's config alone.
    assert target({"KFP_MLFLOW_CONFIG": json.dumps(KFP), "MLFLOW_RUN_ID": "r"}).run_id == "r"


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ("{not json", "KFP_MLFLOW_CONFIG is not JSON"),
        ("[1]", "KFP_MLFLOW_CONFIG is not a JSON object"),
        (json.dumps({**KFP, "parentRunId": ""}), "KFP_MLFLOW_CONFIG lacks 'parentRunId'"),
    ],
)
def test_a_malformed_kfp_config_means_no_tracking_and_says_why(config, why, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_step.master"):
        assert target({"KFP_MLFLOW_CONFIG": config}) is None
    assert why in caplog.text and "not logging to MLflow" in caplog.text
    # A server named by the flag is still used.
    assert target({"KFP_MLFLOW_CONFIG": config}, uri="http://a").tracking_uri == "http://a"


def test_a_run_id_without_any_server_means_no_tracking(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="elastic_step.master"):
        assert target({"MLFLOW_RUN_ID": "r"}) is None
    assert "MLFLOW_RUN_ID is set but no tracking URI is" in caplog.text


def test_a_failure_s_reason_is_the_system_s_error_or_the_first_line() -> None:
    refused = Exception(
        "API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed with exception "
        "HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded (Caused by "
        "NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=1): Failed to establish a "
        'new connection: [Errno 111] Connection refused"))'
    )
    assert reason(refused) == "[Errno 111] Connection refused"
    assert reason(ValueError("RESOURCE_DOES_NOT_EXIST: run x\nmore")) == (
        "ValueError: RESOURCE_DOES_NOT_EXIST: run x"
    )


class RunInMemory(RunTracker):
    """A RunTracker that keeps the run in memory, for the recorder's own bookkeeping (its
    work against a real server is in tests/e2e/test_mlflow.py): the run already holds
    ``had``, and the first ``fail`` sends of metrics fail as a server that is away does."""

    def __init__(self, had: list[MetricPoint], fail: int) -> None:
        self.points = list(had)
        self.fail = fail
        self.ended: RunStatus | None = None

    def open(self, resume_run_id: str | None) -> str:
        return "run-1"

    def logged_points(self) -> Counter[tuple[str, int, float]]:
        return Counter((p.key, p.step, p.value) for p in self.points)

    def log_params(self, params: dict[str, str]) -> None:
        pass

    def log_metrics(self, points) -> None:
        if self.fail:
            self.fail -= 1
            raise TrackingError("logging metrics: [Errno 111] Connection refused")
        self.points += points

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        pass

    def end(self, status: RunStatus) -> None:
        self.ended = status


def test_a_resumed_run_gets_each_point_once_though_a_send_failed() -> None:
    # The run had the first round (and a second one at the same step and value: two rounds
    # of one model) from the master before; this master takes all three rounds again, and
    # its first send fails.
    had = [MetricPoint("eval/loss", 0.5, 10, 0), MetricPoint("eval/loss", 0.5, 10, 0)]
    run = RunInMemory(had, fail=1)
    recorder = TrackingRecorder(
        run, where="memory", params={}, resume_run_id="run-1", on_run=lambda _: None
    )
    recorder._queue([("eval/loss", 0.5, 10), ("eval/loss", 0.5, 10), ("eval/loss", 0.25, 20)])
    recorder.start()
    recorder.finish(None, status=RunStatus.FINISHED, final_metrics={}, artifacts=[], timeout_s=30)
    recorder.close()
    assert [(p.step, p.value) for p in run.points] == [(10, 0.5), (10, 0.5), (20, 0.25)]
    assert run.ended is RunStatus.FINISHED and run.fail == 0
