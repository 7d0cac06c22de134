"""Kubeflow Pipelines 2.17.0's own UI beside its backend (kfp_backend.py): the one way the
tests start it.

:func:`build_kfp_ui` builds the React app and its Node/Express server from the release's
source, with the Node 24 that the UI asks for (``build_kfp_ui.sh``, cached). :func:`start_ui`
runs that server as KFP deploys it (``ml-pipeline-ui``): a pod with its own ServiceAccount
and KFP's Role for it, configured by the Deployment's environment. It serves the app,
proxies ``/apis/...`` to the API server (the Service ``ml-pipeline``) and ``/ml_metadata.*``
to ML Metadata's gRPC-web endpoint (the Service ``metadata-envoy-service``, KFP's Envoy),
and reads artifacts from the object store each artifact names (KFP's default,
``seaweedfs.kubeflow:9000``, which only the cluster's DNS resolves) with the credentials of
the Secret the artifact names. Single-user: no authorization checks, no GKE metadata.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from kfp_backend import (
    API_HTTP_PORT,
    ARTIFACT_SECRET,
    METADATA_ENVOY_PORT,
    METADATA_ENVOY_SERVICE,
    free_port,
)
from kubernetes import client
from local_cluster import (
    Cluster,
    ClusterStartError,
    bind_role,
    create_role,
    run_build,
    wait_for,
)

UI = "ml-pipeline-ui"


def build_kfp_ui() -> Path:
    """The directory of KFP's UI: ``bin/node``, ``build/`` (the app) and ``server/`` (built
    once, then cached), and KFP's Role for it."""
    return run_build("build_kfp_ui.sh", "Kubeflow Pipelines' UI")


@dataclass(frozen=True)
class Ui:
    url: str  # http://127.0.0.1:PORT, the app and its API
    pod: str


def _env(namespace: str) -> list[dict]:
    """The Deployment's environment (manifests/kustomize/base/pipeline), with the Services'
    addresses that a kubelet's service links would give."""

    def field(path: str) -> dict:
        return {"fieldRef": {"fieldPath": path}}

    def secret(key: str) -> dict:
        return {"secretKeyRef": {"name": ARTIFACT_SECRET, "key": key}}

    values = {
        "ML_PIPELINE_SERVICE_HOST": f"ml-pipeline.{namespace}",
        "ML_PIPELINE_SERVICE_PORT": str(API_HTTP_PORT),
        "METADATA_ENVOY_SERVICE_SERVICE_HOST": f"{METADATA_ENVOY_SERVICE}.{namespace}",
        "METADATA_ENVOY_SERVICE_SERVICE_PORT": str(METADATA_ENVOY_PORT),
        "DISABLE_GKE_METADATA": "true",
        "ARGO_ARCHIVE_LOGS": "false",  # no Argo artifact logs here
    }
    sourced = {
        "MINIO_NAMESPACE": field("metadata.namespace"),
        "MINIO_ACCESS_KEY": secret("accesskey"),
        "MINIO_SECRET_KEY": secret("secretkey"),
        "FRONTEND_SERVER_NAMESPACE": field("metadata.namespace"),
    }
    return [{"name": k, "value": v} for k, v in values.items()] + [
        {"name": k, "valueFrom": v} for k, v in sourced.items()
    ]


@contextlib.contextmanager
def start_ui(cluster: Cluster, ui_dir: Path) -> Iterator[Ui]:
    """KFP's UI (see the module) as a pod serving on 127.0.0.1 (a free port: the pod shares
    the machine's addresses); ready once it serves the app and reaches the API server
    through its own proxy; deleted on exit. Needs the Services of kfp_backend.py and
    ``metadata-envoy-service``."""
    ns = cluster.namespace
    port = free_port()
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_service_account(ns, {"metadata": {"name": UI}})
        bind_role(api, ns, create_role(api, ns, ui_dir / "ml-pipeline-ui-role.yaml"), UI)
        node = str(ui_dir / "bin" / "node")
        server = str(ui_dir / "server" / "dist" / "server.js")
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": UI, "labels": {"app": UI}},
                "spec": {
                    "serviceAccountName": UI,
                    "containers": [
                        {
                            "name": UI,
                            "image": "ghcr.io/kubeflow/kfp-frontend:2.17.0",
                            "command": [node, server, str(ui_dir / "build"), str(port)],
                            "workingDir": str(ui_dir / "server"),
                            "env": _env(ns),
                        }
                    ],
                },
            },
        )
        url = f"http://127.0.0.1:{port}"
        try:

            def ready() -> bool:
                pod = core.read_namespaced_pod(UI, ns)
                if pod.status.phase in ("Failed", "Succeeded"):
                    raise ClusterStartError(f"KFP's UI ended: {pod.status}")
                index = requests.get(f"{url}/", timeout=2)
                if not (index.ok and "window.KFP_FLAGS" in index.text):
                    return False
                # 200 either way; apiServerReady says whether the proxy reached the API.
                health = requests.get(f"{url}/apis/v2beta1/healthz", timeout=5)
                return health.ok and health.json().get("apiServerReady") is True

            wait_for("KFP's UI", ready, timeout=90, interval=0.5)
            yield Ui(url, UI)
        finally:
            with contextlib.suppress(client.rest.ApiException):
                core.delete_namespaced_pod(UI, ns, grace_period_seconds=5)
