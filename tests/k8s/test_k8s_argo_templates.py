"""The committed Argo YAML on a real apiserver with Argo's CRDs installed (no Argo controller):
the apiserver validates each object against the CRD's structural schema, which lists every
field, and with strict field validation it refuses any field it does not know."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml
from k8s_helpers import wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "tests" / "schemas" / "argo"
GROUP, VERSION = "argoproj.io", "v1alpha1"


@pytest.fixture(scope="module")
def argo_api(cluster) -> client.CustomObjectsApi:
    """The custom objects API, once Argo's Workflow and WorkflowTemplate CRDs are served."""
    admin = cluster.admin()
    extensions = client.ApiextensionsV1Api(admin)
    for name in ("argoproj.io_workflows.yaml.gz", "argoproj.io_workflowtemplates.yaml.gz"):
        with gzip.open(CRDS / name, "rt") as f:
            crd = yaml.safe_load(f)
        try:
            extensions.create_custom_resource_definition(crd)
        except ApiException as e:
            if e.status != 409:
                raise

        def established(crd_name: str = crd["metadata"]["name"]) -> bool:
            status = extensions.read_custom_resource_definition(crd_name).status
            return any(c.type == "Established" and c.status == "True" for c in status.conditions)

        wait_for(f"CRD {crd['metadata']['name']}", established, timeout=60)
    return client.CustomObjectsApi(admin)


def _create(api: client.CustomObjectsApi, namespace: str, plural: str, body: dict) -> dict:
    return api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, plural, body, field_validation="Strict"
    )


def _document(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_the_workflow_template_is_stored_whole(cluster, argo_api) -> None:
    template = _document("components/argo/workflow-template.yaml")
    _create(argo_api, cluster.namespace, "workflowtemplates", template)
    stored = argo_api.get_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, "workflowtemplates", "elastic-step"
    )
    assert stored["spec"] == template["spec"]  # nothing pruned as unknown
    names = [t["name"] for t in stored["spec"]["templates"]]
    assert names == ["preprocess", "elastic-train", "evaluate", "batch-predict"]


def test_the_example_workflow_is_stored_whole(cluster, argo_api) -> None:
    workflow = _document("pipelines/argo_workflow.yaml")
    created = _create(argo_api, cluster.namespace, "workflows", workflow)
    assert created["metadata"]["name"].startswith("elastic-step-example-")
    assert created["spec"] == workflow["spec"]
    refs = {t["templateRef"]["template"] for t in created["spec"]["templates"][0]["dag"]["tasks"]}
    assert refs == {"preprocess", "elastic-train", "evaluate", "batch-predict"}


def test_the_apiserver_refuses_what_argo_would_not_know(cluster, argo_api) -> None:
    """The check above can fail: a misspelled field and a wrong type are refused."""
    template = _document("components/argo/workflow-template.yaml")
    template["metadata"]["name"] = "elastic-step-misspelled"
    template["spec"]["templates"][1]["retryStrategy"]["limitt"] = "2"
    with pytest.raises(ApiException) as refused:
        _create(argo_api, cluster.namespace, "workflowtemplates", template)
    assert refused.value.status == 400  # strict decoding
    message = json.loads(refused.value.body)["message"]
    assert 'unknown field "spec.templates[1].retryStrategy.limitt"' in message
    template = _document("components/argo/workflow-template.yaml")
    template["metadata"]["name"] = "elastic-step-wrong-type"
    template["spec"]["templates"][0]["container"]["args"] = "preprocess"
    with pytest.raises(ApiException) as refused:
        _create(argo_api, cluster.namespace, "workflowtemplates", template)
    assert refused.value.status == 422
    assert "spec.templates[0].container.args" in json.loads(refused.value.body)["message"]
