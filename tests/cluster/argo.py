"""Argo Workflows' own controller on the test control plane: the one way the Argo tests
start it.

:func:`build_argo` builds ``workflow-controller``, ``argoexec`` and the ``argo`` CLI from the
pinned Go module (``build_argo.sh``, cached). Start the cluster with the returned directory
on the pods' PATH (``start_cluster(..., pod_path=[argo_dir])``): Argo's init and wait
containers run ``argoexec`` from there, and the main container runs the template's own
command (``elastic-step``) below ``argoexec emissary``, as in a real cluster.

:func:`start_argo` then installs what an Argo install has in a namespace and starts the
controller as a host process with the admin kubeconfig (as Argo's own ``make start`` runs
it), watching that namespace only:

- Argo's CRDs and the emissary executor's Role, bound to the workflows' ServiceAccount;
- the ConfigMap ``workflow-controller-configmap``, whose default artifact repository is a
  bucket of the S3 server on loopback (credentials in the Secret ``argo-artifacts``);
- the project's WorkflowTemplate, ``components/argo/workflow-template.yaml``.

The controller's log is ``<workdir>/workflow-controller.log``. The kubelet serves no
``pods/exec``, so the controller's signals to running containers fail at once: a stop
reaches elastic-step's master through the API only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes import client
from local_cluster import (
    REPO,
    Cluster,
    ClusterStartError,
    bind_role,
    create_role,
    create_secret,
    die_with_parent,
    log_tail,
    run_build,
    stop_process,
    wait_for,
)

#: The controller's settings in a test: workflows requeued every second, a pod missing for
#: 3 s counts as deleted, no leader election, no progress patches.
CONTROLLER_ENV = {
    "LEADER_ELECTION_DISABLE": "true",
    "DEFAULT_REQUEUE_TIME": "1s",
    "RECENTLY_STARTED_POD_DURATION": "3s",
    "ARGO_PROGRESS_PATCH_TICK_DURATION": "0",
}
ARTIFACT_SECRET = "argo-artifacts"
WORKFLOW_TEMPLATE = REPO / "components" / "argo" / "workflow-template.yaml"


def build_argo() -> Path:
    """The directory of Argo's binaries, CRDs and executor Role (built once, then cached)."""
    return run_build("build_argo.sh", "Argo Workflows")


@dataclass(frozen=True)
class Argo:
    cluster: Cluster
    bin_dir: Path
    namespace: str
    #: The artifact repository's bucket on the S3 server.
    bucket: str
    log: Path

    def cli(self, *args: str, timeout: float = 60) -> str:
        """Runs the ``argo`` CLI as a user does (kubeconfig, no Argo Server); its output."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
        env["KUBECONFIG"] = str(self.cluster.admin_kubeconfig)
        result = subprocess.run(
            [str(self.bin_dir / "argo"), "-n", self.namespace, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"argo {' '.join(args)}: {result.stderr or result.stdout}")
        return result.stdout


def _install_crds(api: client.ApiClient, crds: Path) -> None:
    extensions = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(crds.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        with contextlib.suppress(client.rest.ApiException):  # 409: installed already
            extensions.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])

    def established() -> bool:
        for name in names:
            conditions = extensions.read_custom_resource_definition(name).status.conditions
            if not any(c.type == "Established" and c.status == "True" for c in conditions or []):
                return False
        return True

    wait_for("Argo's CRDs", established, timeout=60)


def _controller_config(bucket: str, s3_endpoint: str, region: str) -> dict:
    repository = {
        "s3": {
            "bucket": bucket,
            "endpoint": s3_endpoint.removeprefix("http://"),
            "insecure": True,
            "region": region,
            "accessKeySecret": {"name": ARTIFACT_SECRET, "key": "accessKey"},
            "secretKeySecret": {"name": ARTIFACT_SECRET, "key": "secretKey"},
        }
    }
    return {
        "metadata": {"name": "workflow-controller-configmap"},
        "data": {
            "artifactRepository": yaml.safe_dump(repository),
            # Its default port, 9090, may be taken; a bind failure would end the controller.
            "metricsConfig": "enabled: false\n",
        },
    }


@contextlib.contextmanager
def start_argo(
    cluster: Cluster,
    bin_dir: Path,
    *,
    s3_env: dict[str, str],
    bucket: str,
    service_account: str = "elastic-step-master",
) -> Iterator[Argo]:
    """Installs Argo in the cluster's namespace and runs its controller until exit (see the
    module). ``s3_env``: the S3 server's AWS_* variables; ``bucket`` must exist there."""
    ns = cluster.namespace
    with cluster.admin() as api:
        _install_crds(api, bin_dir / "crds")
        credentials = {
            "accessKey": s3_env["AWS_ACCESS_KEY_ID"],
            "secretKey": s3_env["AWS_SECRET_ACCESS_KEY"],
        }
        create_secret(api, ns, ARTIFACT_SECRET, credentials)
        client.CoreV1Api(api).create_namespaced_config_map(
            ns,
            _controller_config(bucket, s3_env["AWS_ENDPOINT_URL"], s3_env["AWS_DEFAULT_REGION"]),
        )
        bind_role(api, ns, create_role(api, ns, bin_dir / "executor-role.yaml"), service_account)
        template = yaml.safe_load(
            (REPO / "components" / "argo" / "workflow-template.yaml").read_text()
        )
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", ns, "workflowtemplates", template
        )
    log_path = cluster.workdir / "workflow-controller.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
    with log_path.open("wb") as log:
        controller = subprocess.Popen(
            [
                str(bin_dir / "workflow-controller"),
                f"--kubeconfig={cluster.admin_kubeconfig}",
                f"--namespace={ns}",
                "--namespaced",
                "--executor-image=argoexec:local",  # the kubelet ignores images
                "--workflow-workers=4",
                "--pod-cleanup-workers=2",
            ],
            env={**env, **CONTROLLER_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    try:

        def running() -> bool:
            if controller.poll() is not None:
                raise ClusterStartError(f"workflow-controller exited:\n{log_tail(log_path)}")
            return "Starting Workflow Controller" in log_path.read_text(errors="replace")

        wait_for("Argo's workflow-controller", running, timeout=60)
        yield Argo(cluster, bin_dir, ns, bucket, log_path)
    finally:
        stop_process(controller, timeout=15)
