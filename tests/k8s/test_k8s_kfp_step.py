"""What the KFP training step needs from the cluster: the Role bound to KFP's run service
account (manifests/kfp-pipeline-runner-rolebinding.yaml), and its job's name, read in its
own pod from the run's ``pipeline/runid`` label, which a retried step (a new pod) finds again."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml
from k8s_helpers import container_log, field_env, last_json_line, python_pod, wait_terminal
from kubernetes import client, utils

from elastic_step.components.identity import job_name_for

REPO = Path(__file__).resolve().parents[2]
RUNNER = "pipeline-runner"

JOB_NAME = """
import json, os
from elastic_step.components.identity import kfp_job_name
from elastic_step.errors import ElasticStepError
try:
    name = kfp_job_name(job_name="", task_name="elastic-train", output="", env=os.environ)
    out = {"job_name": name}
except ElasticStepError as e:
    out = {"error": str(e)}
print(json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def pipeline_runner(cluster) -> str:
    """KFP's run service account, with the master's Role bound by the committed manifest."""
    with cluster.admin() as api:
        client.CoreV1Api(api).create_namespaced_service_account(
            cluster.namespace, {"metadata": {"name": RUNNER}}
        )
        manifest = REPO / "manifests" / "kfp-pipeline-runner-rolebinding.yaml"
        utils.create_from_dict(
            api, yaml.safe_load(manifest.read_text()), namespace=cluster.namespace
        )
    return RUNNER


def test_the_binding_gives_the_run_account_the_masters_verbs(cluster, pipeline_runner) -> None:
    user = f"system:serviceaccount:{cluster.namespace}:{pipeline_runner}"

    def allowed(verb: str, resource: str, group: str = "") -> bool:
        review = {
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "resourceAttributes": {
                    "namespace": cluster.namespace,
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                },
            }
        }
        with cluster.admin() as api:
            answer = client.AuthorizationV1Api(api).create_subject_access_review(review)
        return answer.status.allowed

    assert allowed("create", "pods") and allowed("delete", "pods") and allowed("get", "pods")
    assert allowed("create", "services") and allowed("create", "leases", "coordination.k8s.io")
    assert not allowed("list", "secrets")  # only what the master needs


def test_a_retried_step_reads_the_same_job_name_from_its_pod(cluster, pipeline_runner) -> None:
    run, other_run = str(uuid.uuid4()), str(uuid.uuid4())
    suffix = uuid.uuid4().hex[:6]
    pods = {  # pod name -> its run's id (None: a pod that is not KFP's)
        f"train-{suffix}": run,
        f"train-retry-{suffix}": run,
        f"other-run-{suffix}": other_run,
        f"not-kfp-{suffix}": None,
    }
    env = [field_env("KFP_POD_NAME", "metadata.name"), {"name": "PYTHONPATH", "value": str(REPO)}]
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        for name, run_id in pods.items():
            labels = {"pipeline/runid": run_id} if run_id else {}
            body = python_pod(name, JOB_NAME, labels=labels, env=env, serviceAccountName=RUNNER)
            core.create_namespaced_pod(cluster.namespace, body)
        found = {}
        for name in pods:
            pod = wait_terminal(core, cluster.namespace, name)
            log = container_log(cluster.workdir, pod)
            assert pod.status.phase == "Succeeded", log
            found[name] = last_json_line(log)
    names = list(pods)
    assert found[names[0]] == found[names[1]] == {"job_name": job_name_for(run, "elastic-train")}
    assert found[names[2]] == {"job_name": job_name_for(other_run, "elastic-train")}
    assert found[names[3]] == {
        "error": f"pod {names[3]} has no pipeline/runid label: is this step running under "
        "Kubeflow Pipelines? Pass a job_name otherwise"
    }
