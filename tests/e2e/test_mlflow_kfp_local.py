"""The elastic-train component under kfp.local with KFP 2.17's MLflow variables in its
environment, as KFP's MLflow plugin sets them on the task's container, against a real
`mlflow server`:

- ``KFP_MLFLOW_CONFIG`` alone: the step makes its run in KFP's experiment, nested under
  KFP's parent run, and ends it;
- with ``injectUserEnvVars`` on (``MLFLOW_RUN_ID``, ``MLFLOW_TRACKING_URI``,
  ``MLFLOW_EXPERIMENT_ID`` too): the step logs into the task's nested run that KFP made, and
  leaves ending it to KFP's launcher.
"""

# No `from __future__ import annotations`: kfp reads the pipeline's annotations as types.
import json
from collections.abc import Iterator

import pytest
from kfp import dsl, local
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer

from elastic_step.components.kfp_components import elastic_train
from elastic_step.examples import path_of

pytestmark = [
    pytest.mark.e2e,
    # kfp.local warns that the image does not look like a Python image: it runs the
    # components in this environment instead, which is the point.
    pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning"),
]

PARENT_TAG = "mlflow.parentRunId"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


def run_train_step(root, data, env: dict) -> None:
    """One elastic-train task (1 epoch, 1 local worker) with ``env`` in its environment."""

    @dsl.pipeline
    def mlflow_pipeline(data_uri: str, model_def_uri: str) -> None:
        dataset = dsl.importer(artifact_uri=data_uri, artifact_class=dsl.Dataset, reimport=False)
        model_def = dsl.importer(
            artifact_uri=model_def_uri, artifact_class=dsl.Artifact, reimport=False
        )
        train = elastic_train(
            dataset=dataset.output,
            model_def=model_def.output,
            epochs=1,
            workers=1,
            records_per_task=256,
            backend="local",
            task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        )
        for name, value in env.items():
            train.set_env_variable(name, value)
        train.set_caching_options(False)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    mlflow_pipeline(data_uri=str(data), model_def_uri=path_of("digits"))


def kfp_config(server: MlflowServer, experiment: str, parent: str, **extra) -> str:
    """KFP_MLFLOW_CONFIG as KFP's driver writes it for a task."""
    config = {
        "endpoint": server.uri,
        "experimentId": experiment,
        "parentRunId": parent,
        "authType": "none",
        "timeout": "30s",
        **extra,
    }
    return json.dumps(config)


def summary_of(root) -> dict:
    (path,) = root.glob("*/elastic-train/executor_output.json")
    train = json.loads(path.read_text())["artifacts"]
    return json.loads(open(train["summary"]["artifacts"][0]["uri"]).read())


def pipeline_run(server: MlflowServer, experiment_name: str) -> tuple[MlflowClient, str, str]:
    """What KFP has made in MLflow before a run's tasks start: a new experiment, and in it
    the pipeline run's own run, still running. (A client, the experiment's id, the run's.)"""
    client = server.client()
    experiment = client.create_experiment(experiment_name)
    parent = client.create_run(experiment, run_name="pipeline-run").info.run_id
    return client, experiment, parent


def test_kfp_s_mlflow_config_nests_the_step_s_run_under_the_pipeline_run(
    server, digits_data, tmp_path
) -> None:
    client, experiment, parent = pipeline_run(server, "kfp-config")
    run_train_step(
        tmp_path, digits_data, {"KFP_MLFLOW_CONFIG": kfp_config(server, experiment, parent)}
    )
    summary = summary_of(tmp_path)

    [run] = client.search_runs([experiment], filter_string=f"tags.`{PARENT_TAG}` = '{parent}'")
    assert run.info.run_name == summary["job_name"] and run.info.status == "FINISHED"
    assert run.data.metrics["final/loss"] == pytest.approx(summary["metrics"]["loss"])
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "eval/loss")]
    assert steps == [e["model_version"] for e in summary["evaluations"]]
    assert client.get_run(parent).info.status == "RUNNING"  # KFP's to end


def test_kfp_s_injected_run_gets_the_step_s_metrics_and_kfp_ends_it(
    server, digits_data, tmp_path
) -> None:
    client, experiment, parent = pipeline_run(server, "kfp-injected")
    # What KFP's driver made for the task before it started (plugin's OnTaskStart).
    nested = client.create_run(
        experiment, run_name="elastic-train", tags={PARENT_TAG: parent}
    ).info.run_id
    run_train_step(
        tmp_path,
        digits_data,
        {
            "KFP_MLFLOW_CONFIG": kfp_config(server, experiment, parent, injectUserEnvVars=True),
            "MLFLOW_RUN_ID": nested,
            "MLFLOW_TRACKING_URI": server.uri,
            "MLFLOW_EXPERIMENT_ID": experiment,
        },
    )
    summary = summary_of(tmp_path)

    runs = client.search_runs([experiment])
    assert {r.info.run_id for r in runs} == {parent, nested}  # no run of its own
    run = client.get_run(nested)
    assert run.info.status == "RUNNING"  # KFP's launcher ends it
    assert run.data.params["epochs"] == "1"
    assert run.data.metrics["final/accuracy"] == pytest.approx(summary["metrics"]["accuracy"])
    assert {a.path for a in client.list_artifacts(nested)} >= {"summary.json", "model"}
