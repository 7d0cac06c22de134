"""Kubeflow Pipelines 2.17.0's own backend on the test control plane (tests/cluster/
kfp_backend.py): the example pipeline, compiled, uploaded and run as a user runs it with
``kfp.Client(host=...)``. KFP's API server turns the run into an Argo Workflow, its driver
records each task in ML Metadata, its launcher wraps the components' commands, and its
persistence agent reports the Workflow's state back to the run.

Beside a whole run: KFP's Terminate during training; the training step's pod deleted, then
KFP's Retry of the failed run; and KFP's cache over two identical runs.
"""

from __future__ import annotations

import json

import pytest
from argo_helpers import PodRecorder, job_pods, seconds_until
from kfp import Client
from kfp_helpers import (
    KFP_BUCKET,
    PIPELINE_NAME,
    SMALL,
    TRAIN_TASK,
    client_for,
    master_log,
    master_pod,
    retry_run,
    run_example,
    task_states,
    train_job_name,
    train_output_keys,
    wait_for_run,
    wait_for_training,
)
from kubernetes import client
from local_cluster import container_log

# kfp.Client warns that it needs a backend of at least 2.0.0-beta.2: this one is 2.17.0.
pytestmark = pytest.mark.filterwarnings("ignore:This client only works:FutureWarning")


@pytest.mark.timeout(600)  # with the backend's start, for the first KFP test of a session
def test_the_example_pipeline_succeeds_on_kfps_backend(argo, kfp, s3_server):
    user = client_for(kfp.api.http)
    run_id = run_example(user, epochs=2, **SMALL)
    with argo.cluster.admin() as api:
        recorder = PodRecorder(api, argo.namespace, train_job_name(run_id))
        try:
            run = wait_for_run(user, run_id, timeout=900)
        finally:
            recorder.stop()
    states = task_states(run)
    assert str(run.state) == "SUCCEEDED", (run.state, states, run.error)
    # Every task KFP shows (the components, their drivers and executors, the importers).
    assert {"preprocess", TRAIN_TASK, "evaluate", "batch-predict"} <= set(states), states
    assert set(states.values()) == {"SUCCEEDED"}, states

    # The training step's master started its workers and PS as pods.
    roles = recorder.roles()
    assert roles.get("worker", 0) >= 2 and roles.get("ps", 0) >= 1, recorder.seen

    # Its outputs are in KFP's bucket, under the run's root.
    prefix = f"v2/artifacts/{PIPELINE_NAME}/{run_id}/"
    keys = s3_server.keys(KFP_BUCKET, prefix)
    summary_keys = [k for k in keys if f"/{TRAIN_TASK}/" in k and k.endswith("/summary")]
    assert summary_keys, keys
    summary = json.loads(s3_server.read(KFP_BUCKET, summary_keys[0]))
    assert summary["phase"] == "succeeded" and len(summary["epochs"]) == 2, summary
    assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])

    # The Metrics and ClassificationMetrics artifacts are in ML Metadata, where the UI
    # reads them: training's with summary.json's values, evaluate's with its confusion matrix.
    artifacts = kfp.mlmd.artifacts_of_run(run_id)
    (train_metrics,) = [
        a for a in artifacts if a["type"] == "system.Metrics" and a["task"] == TRAIN_TASK
    ]
    for name, value in summary["metrics"].items():
        # MLMD's store keeps 6 significant digits of a double (it binds them into SQL text).
        assert train_metrics["metadata"][name] == pytest.approx(value, rel=1e-5), name
    (classification,) = [a for a in artifacts if a["type"] == "system.ClassificationMetrics"]
    matrix = classification["metadata"]["confusionMatrix"]["struct"]  # where the UI reads it
    assert [s["displayName"] for s in matrix["annotationSpecs"]] == ["0", "1"], matrix


def _training_run(kfp, s3_server, epochs: int) -> tuple[Client, str, str]:
    """A run of the example pipeline, once its training job is under way: (the user's
    client, the run's id, the job's name)."""
    user = client_for(kfp.api.http)
    run_id = run_example(user, epochs=epochs, **SMALL)
    wait_for_training(s3_server, run_id, version=1, timeout=600)
    return user, run_id, train_job_name(run_id)


def test_terminate_during_training_leaves_no_pod_of_the_job_within_20_s(argo, kfp, s3_server):
    ns = argo.namespace
    user, run_id, job = _training_run(kfp, s3_server, epochs=200)
    with argo.cluster.admin() as api:
        core = client.CoreV1Api(api)
        assert job_pods(core, ns, job), "the job has no pods while it trains"
        user.terminate_run(run_id)  # KFP sets the Workflow's activeDeadlineSeconds to 0
        elapsed = seconds_until(lambda: not job_pods(core, ns, job), timeout=120)
        print(f"KFP Terminate -> no pod of the job after {elapsed:.1f} s")
        assert elapsed <= 20, elapsed
        run = wait_for_run(user, run_id, timeout=120)
    print(f"KFP shows the terminated run as {run.state}")
    # KFP 2.17 has no CANCELED from a Workflow: the persistence agent reports the Workflow's
    # end (Failed, its deadline exceeded), which the API server shows as FAILED.
    assert str(run.state) == "FAILED", (run.state, task_states(run))


@pytest.mark.timeout(600)  # two attempts of a 40-epoch job
def test_a_run_whose_master_pod_was_deleted_succeeds_on_retry_and_adopts_the_workers(
    argo, kfp, s3_server
):
    """KFP compiles ``set_retry`` to an Argo retryStrategy without a retryPolicy (OnFailure),
    which does not retry a step whose pod was deleted (an Error): the run fails, and the
    master, seeing its pod deleted under a Workflow, leaves its workers and PS running for
    the next master. KFP's Retry (the UI's button) starts the training step again in the
    same run: its master finds the job by the run's id and the task's name and adopts them."""
    ns = argo.namespace
    user, run_id, job = _training_run(kfp, s3_server, epochs=40)
    with argo.cluster.admin() as api:
        core = client.CoreV1Api(api)
        workers = set(job_pods(core, ns, job))
        master = master_pod(core, ns, run_id)
        core.delete_namespaced_pod(master.metadata.name, ns)  # its grace period: a SIGTERM
        failed = wait_for_run(user, run_id, timeout=300)
        first = container_log(argo.cluster.workdir, master)
        assert str(failed.state) == "FAILED", (failed.state, task_states(failed))
        # The launcher dies of the SIGTERM too, so the master's last lines are lost with
        # its stdout: what shows the handover is that the workers and PS wait.
        assert set(job_pods(core, ns, job)) == workers, (workers, first[-2000:])

        retry_run(kfp.api.http, run_id)
        run = wait_for_run(user, run_id, timeout=900, leaving="FAILED")
        retried = master_log(argo.cluster.workdir, core, ns, run_id, other_than=master)
    assert str(run.state) == "SUCCEEDED", (run.state, task_states(run), retried[-3000:])
    adopted = retried.split("adopted", 1)
    assert len(adopted) == 2, retried[-3000:]
    for worker in workers:
        assert worker.removeprefix(f"{job}-") in adopted[1], retried[-3000:]
    keys = train_output_keys(s3_server, run_id)
    (summary_key,) = [k for k in keys if k.endswith("/model/summary.json")]
    summary = json.loads(s3_server.read(KFP_BUCKET, summary_key))
    assert summary["restarts"] == {"worker": 0, "ps": 0, "master": 1}, summary["restarts"]
    assert len(summary["epochs"]) == 40
    assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
    # The retried step wrote to the same output URI: KFP's driver chose it once.
    outputs = {k.split(f"/{TRAIN_TASK}/", 1)[1].split("/", 1)[0] for k in keys}
    print(f"training outputs under {sorted(outputs)}")
    assert len(outputs) == 1, outputs


@pytest.mark.timeout(600)  # two runs
def test_a_second_identical_run_reuses_preprocess_and_trains_again(argo, kfp):
    user = client_for(kfp.api.http)
    runs = []
    for _ in range(2):  # one after the other: the second finds the first's in the cache
        run_id = run_example(user, epochs=1, **SMALL)
        run = wait_for_run(user, run_id, timeout=300)
        assert str(run.state) == "SUCCEEDED", (run.state, task_states(run))
        runs.append(run_id)
    first, second = runs

    def output(run_id: str, task: str, kind: str) -> str:
        artifacts = kfp.mlmd.artifacts_of_run(run_id)
        (uri,) = [a["uri"] for a in artifacts if a["task"] == task and a["type"] == kind]
        return uri

    # preprocess came from KFP's cache: the second run's data is the first run's.
    data = [output(run_id, "preprocess", "system.Dataset") for run_id in (first, second)]
    assert data[0] == data[1], data
    # Training ran again (the example pipeline turns its cache off): a model of its own.
    for run_id in (first, second):
        assert f"/{run_id}/" in output(run_id, TRAIN_TASK, "system.Model")
