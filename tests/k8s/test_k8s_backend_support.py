"""Shared by the Kubernetes backend's tests (no tests here): a namespace where the
``restricted`` Pod Security Standard is enforced, with the project's Role, kubeconfigs for
its ServiceAccounts, and a stand-in master pod."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from k8s_helpers import PACED, container_log, wait_for
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from local_cluster import write_token_kubeconfig

from elastic_step.backends.kubernetes import KubernetesBackend
from elastic_step.backends.kubernetes_options import KubernetesOptions
from elastic_step.demo import write_digits_csv

REPO = Path(__file__).resolve().parents[2]
RESTRICTED_NAMESPACE = "es-restricted"
MASTER_SA = "elastic-step-master"
PY = sys.executable


@dataclass(frozen=True)
class Restricted:
    """A namespace labelled pod-security.kubernetes.io/enforce=restricted."""

    name: str
    #: As the elastic-step-master ServiceAccount (the project's Role).
    master_kubeconfig: Path
    #: As the namespace's "default" ServiceAccount, which may do nothing.
    nobody_kubeconfig: Path


@pytest.fixture(scope="session", name="restricted")
def restricted_fixture(cluster) -> Restricted:
    """Import this into a test module (its name is ``restricted``)."""
    ns = RESTRICTED_NAMESPACE
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        try:
            core.create_namespace({"metadata": {"name": ns, "labels": labels}})
        except ApiException as e:
            if e.status != 409:
                raise
        for doc in yaml.safe_load_all((REPO / "manifests" / "rbac.yaml").read_text()):
            try:
                utils.create_from_dict(api, doc, namespace=ns)
            except utils.FailToCreateError as err:
                if any(e.status != 409 for e in err.api_exceptions):
                    raise
        wait_for(
            "the default ServiceAccount",
            lambda: core.read_namespaced_service_account("default", ns),
            timeout=60,
        )

        def token(account: str) -> str:
            request = {"spec": {"expirationSeconds": 4 * 3600}}
            return core.create_namespaced_service_account_token(account, ns, request).status.token

        admin_kubeconfig = cluster.admin_kubeconfig
        work = cluster.workdir
        return Restricted(
            ns,
            write_token_kubeconfig(
                work / f"{ns}-master.kubeconfig", admin_kubeconfig, ns, MASTER_SA, token(MASTER_SA)
            ),
            write_token_kubeconfig(
                work / f"{ns}-nobody.kubeconfig", admin_kubeconfig, ns, "nobody", token("default")
            ),
        )


def clean_namespace(cluster, namespace: str) -> None:
    """Deletes every pod, Service, Secret and ConfigMap the tests left in ``namespace``."""
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        selector = "app.kubernetes.io/managed-by=elastic-step"
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        for service in core.list_namespaced_service(namespace, label_selector=selector).items:
            core.delete_namespaced_service(service.metadata.name, namespace)
        core.delete_collection_namespaced_secret(namespace, label_selector=selector)
        core.delete_collection_namespaced_config_map(namespace, label_selector=selector)
        wait_for(
            f"namespace {namespace} without pods",
            lambda: not core.list_namespaced_pod(namespace).items,
            timeout=60,
        )


def restricted_pod(name: str, command: list[str], **extra) -> dict:
    """A pod that the restricted Pod Security Standard admits, as the process kubelet runs it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "elastic-step-test"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": "local/process",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    **extra,
                }
            ],
        },
    }


SLEEP_THROUGH_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
)


def start_master_pod(
    core: client.CoreV1Api, namespace: str, code: str = "import time; time.sleep(600)"
) -> str:
    """A pod standing in for the master's own pod (a sleeping process); returns its name."""
    name = f"master-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(namespace, restricted_pod(name, [PY, "-c", code]))

    def running() -> bool:
        return core.read_namespaced_pod(name, namespace).status.phase == "Running"

    wait_for(f"master pod {name} Running", running, timeout=60)
    return name


def new_job_name() -> str:
    return f"job-{uuid.uuid4().hex[:6]}"


def make_backend(
    kubeconfig: Path,
    namespace: str,
    job: str,
    master_pod: str | None,
    backend_kw: dict | None = None,
    **options,
) -> KubernetesBackend:
    """A backend as the master of ``job`` would make it, with ``options`` as flags."""
    return KubernetesBackend(
        job,
        KubernetesOptions(namespace=namespace, kubeconfig=str(kubeconfig), **options),
        master_pod=master_pod,
        **(backend_kw or {}),
    )


@pytest.fixture
def admin_core(cluster) -> Iterator[client.CoreV1Api]:
    with cluster.admin() as api:
        yield client.CoreV1Api(api)


@pytest.fixture(scope="session", name="digits")
def digits_fixture(tmp_path_factory) -> Path:
    """scikit-learn's digits, preprocessed; import into a test module (its name is ``digits``)."""
    root = tmp_path_factory.mktemp("digits")
    write_digits_csv(str(root / "digits.csv"))
    subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(root / "digits.csv"),
         "--label", "digit", "--output", str(root / "data")],
        cwd=REPO, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return root / "data"


def read_status(output: Path) -> dict:
    """The job's status.json in ``output``; {} before the master first writes it."""
    try:
        return json.loads((output / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def pod_log(cluster, core: client.CoreV1Api, name: str, namespace: str) -> str:
    """The end of pod ``name``'s log, for an assertion's message; or why there is none."""
    try:
        return container_log(cluster.workdir, core.read_namespaced_pod(name, namespace))[-3000:]
    except Exception as e:
        return f"<no log: {e}>"


def paced_train_argv(digits: Path, output: Path | str, job: str, *flags: str) -> list[str]:
    """``elastic-step train`` of the paced model (k8s_helpers.PACED) on ``digits``, as job
    ``job`` on the Kubernetes backend, with ``flags`` for the rest of its settings."""
    return [
        sys.executable, "-m", "elastic_step", "train",
        "--model-def", str(PACED), "--data", str(digits), "--output", str(output),
        "--seed", "7", "--job-name", job, "--backend", "kubernetes",
        # The process kubelet runs pods on this machine: they import this checkout.
        "--env", f"PYTHONPATH={REPO}",
        *flags,
    ]  # fmt: skip


def master_pod_manifest(name: str, argv: list[str]) -> dict:
    """The master's pod, as a pipeline step or a Kubernetes Job would run it: the project's
    ServiceAccount (its token mounted), its own name and IP from the downward API."""
    env = [
        {
            "name": "ELASTIC_STEP_POD_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
        {"name": "ELASTIC_STEP_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PYTHONPATH", "value": str(REPO)},
    ]
    pod = restricted_pod(name, argv, env=env, workingDir=str(REPO))
    pod["spec"]["serviceAccountName"] = "elastic-step-master"
    pod["spec"]["automountServiceAccountToken"] = True
    return pod
