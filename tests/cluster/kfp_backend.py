"""Kubeflow Pipelines 2.17.0's own backend on the test control plane, beside Argo's
controller (argo.py): the one way the KFP tests start it.

:func:`build_kfp` builds the API server, the persistence agent, the v2 driver and launcher
from the release's source (``build_kfp.sh``, cached). Start the cluster with that directory
on the pods' PATH: the compiled Workflows' driver steps run ``driver`` and their init
containers ``launcher-v2``, as in KFP's images.

- :func:`start_mariadb` runs Debian's MariaDB server on loopback with a data directory of
  its own (KFP's stores speak MySQL's dialect only).
- :func:`install_pipeline_runtime` makes what a default install gives the namespace where
  pipelines run: the ServiceAccount ``pipeline-runner`` with KFP's Role (and elastic-step's,
  as docs/guides/pipelines.md asks of a user), the ``kfp-launcher`` ConfigMap (pipeline root
  ``minio://mlpipeline/v2/artifacts``), the Secret ``mlpipeline-minio-artifact``, and the
  object store at KFP's default address, ``seaweedfs.kubeflow:9000``.
- :func:`start_api_server` runs KFP's API server as a host process, as KFP's own development
  setup runs it (its config from ``config.json`` and the environment, the cluster through
  the admin kubeconfig, its pipelines in a bucket of the S3 server), published as the
  Service ``ml-pipeline`` on the ports the driver, the launcher and the persistence agent
  dial.
- :func:`start_persistence_agent` runs the persistence agent as KFP deploys it: a pod with
  its own ServiceAccount and Role, and its token projected where the agent reads it.

:func:`start_kfp` starts them all, with ML Metadata (mlmd.py), the one way the tests and
the bench do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from host_services import publish, service_address
from kubernetes import client, utils
from local_cluster import (
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
from mlmd import MLMD_PORT, Mlmd, start_mlmd

#: The ServiceAccount KFP runs pipelines as (DEFAULTPIPELINERUNNERSERVICEACCOUNT).
PIPELINE_RUNNER = "pipeline-runner"
PERSISTENCE_AGENT = "ml-pipeline-persistenceagent"
#: Ports KFP's binaries hard-code: the API server's gRPC and HTTP (driver, launcher and
#: persistence agent), and the default object store's (ML Metadata's is mlmd.py's).
API_GRPC_PORT, API_HTTP_PORT, OBJECT_STORE_PORT = 8887, 8888, 9000
#: KFP's Envoy in front of ML Metadata for the UI (gRPC-web): its Service and port. MLMD's
#: server (mlmd.py) speaks gRPC-web itself, so the Service points at it.
METADATA_ENVOY_SERVICE, METADATA_ENVOY_PORT = "metadata-envoy-service", 9090
#: KFP's own bucket, as in a default install: its pipelines and the runs' artifacts.
KFP_BUCKET = "mlpipeline"
#: Indexes of the cluster's service addresses (host_services.py) that KFP's servers take.
API_SERVER_ADDRESS, MLMD_ADDRESS, OBJECT_STORE_ADDRESS = 1, 2, 3
#: A default install's pipeline root, object store and its Secret (KFP 2.17: SeaweedFS, in
#: namespace kubeflow; the Secret keeps MinIO's name and keys).
PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"
OBJECT_STORE_SERVICE, OBJECT_STORE_NAMESPACE = "seaweedfs", "kubeflow"
ARTIFACT_SECRET = "mlpipeline-minio-artifact"


def build_kfp() -> Path:
    """The directory of KFP's binaries, CRD and config (built once, then cached)."""
    return run_build("build_kfp.sh", "Kubeflow Pipelines")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Database:
    host: str
    port: int
    user: str
    password: str


@contextlib.contextmanager
def start_mariadb(workdir: Path) -> Iterator[Database]:
    """MariaDB on 127.0.0.1 with its files under ``workdir``, and a user that may create
    KFP's database; stopped on exit."""
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/sbin", "/usr/bin"])
    found = {c: shutil.which(c, path=path) for c in ("mariadbd", "mariadb-install-db", "mariadb")}
    for command, where in found.items():
        if where is None:
            raise ClusterStartError(f"{command} not found: install Debian's mariadb-server")
    datadir, socket_path = workdir / "mariadb", workdir / "mariadb.sock"
    log_path = workdir / "mariadb.log"
    with log_path.open("wb") as log:
        subprocess.run(
            [found["mariadb-install-db"], "--no-defaults", f"--datadir={datadir}", "--user=root",
             "--skip-test-db", "--auth-root-authentication-method=socket"],
            stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120,
        )  # fmt: skip
        port = free_port()
        server = subprocess.Popen(
            [found["mariadbd"], "--no-defaults", f"--datadir={datadir}", f"--socket={socket_path}",
             f"--port={port}", "--bind-address=127.0.0.1", "--user=root",
             f"--pid-file={workdir / 'mariadb.pid'}", "--skip-log-bin"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    try:
        database = Database("127.0.0.1", port, "kfp", "kfp-test-password")
        statements = (
            f"CREATE USER '{database.user}'@'127.0.0.1' IDENTIFIED BY '{database.password}';"
            f"GRANT ALL ON *.* TO '{database.user}'@'127.0.0.1';"
        )

        def ready() -> bool:
            if server.poll() is not None:
                raise ClusterStartError(f"mariadbd exited:\n{log_tail(log_path)}")
            sql = [found["mariadb"], "--no-defaults", f"--socket={socket_path}", "-u", "root"]
            return subprocess.run([*sql, "-e", statements], capture_output=True).returncode == 0

        wait_for("MariaDB", ready, timeout=60, interval=0.5)
        yield database
    finally:
        stop_process(server, timeout=30)


def install_pipeline_runtime(
    cluster: Cluster, kfp_dir: Path, *, s3_env: dict[str, str], object_store: str
) -> None:
    """What a default install gives the namespace its pipelines run in (see the module).
    ``object_store``: the address (host:port) of the S3 server's store, which answers as
    ``seaweedfs.kubeflow:9000``; ``s3_env``: its credentials."""
    ns = cluster.namespace
    host, port = object_store.rsplit(":", 1)
    if int(port) != OBJECT_STORE_PORT:
        raise ValueError(f"object store {object_store}: KFP dials port {OBJECT_STORE_PORT}")
    with cluster.admin() as api:
        publish(api, OBJECT_STORE_NAMESPACE, OBJECT_STORE_SERVICE, host, {"s3": OBJECT_STORE_PORT})
        credentials = {
            "accesskey": s3_env["AWS_ACCESS_KEY_ID"],
            "secretkey": s3_env["AWS_SECRET_ACCESS_KEY"],
        }
        create_secret(api, ns, ARTIFACT_SECRET, credentials)
        core = client.CoreV1Api(api)
        core.create_namespaced_config_map(
            ns,
            {"metadata": {"name": "kfp-launcher"}, "data": {"defaultPipelineRoot": PIPELINE_ROOT}},
        )
        core.create_namespaced_service_account(ns, {"metadata": {"name": PIPELINE_RUNNER}})
        runner_role = create_role(api, ns, kfp_dir / "pipeline-runner-role.yaml")
        bind_role(api, ns, runner_role, PIPELINE_RUNNER)
        # elastic-step's own Role (manifests/rbac.yaml, applied in the namespace by the
        # cluster), as docs/guides/pipelines.md asks a user to bind it to the run's ServiceAccount.
        bind_role(api, ns, "elastic-step-master", PIPELINE_RUNNER)


@dataclass(frozen=True)
class ApiServer:
    http: str  # http://ADDRESS:8888, what kfp.Client(host=...) takes
    log: Path


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners do
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def start_api_server(
    cluster: Cluster,
    kfp_dir: Path,
    database: Database,
    *,
    s3_env: dict[str, str],
    bucket: str,
) -> Iterator[ApiServer]:
    """KFP's API server for the cluster's namespace (see the module); stopped on exit.
    Needs Argo's CRDs installed; installs KFP's ScheduledWorkflow CRD."""
    ns = cluster.namespace
    address = service_address(cluster.pod_cidr, API_SERVER_ADDRESS)
    # The gateway dials "localhost" + the gRPC flag, so the server binds that port on every
    # address: one API server per machine at a time.
    if not _port_is_free(API_GRPC_PORT):
        raise ClusterStartError(
            f"port {API_GRPC_PORT} is taken: KFP's API server listens on it on every address "
            "(is another KFP test session running?)"
        )
    with cluster.admin() as api:
        with contextlib.suppress(utils.FailToCreateError):  # installed already
            utils.create_from_yaml(api, str(kfp_dir / "scheduled-workflow-crd.yaml"))
        publish(api, ns, "ml-pipeline", address, {"http": API_HTTP_PORT, "grpc": API_GRPC_PORT})
    endpoint = s3_env["AWS_ENDPOINT_URL"].removeprefix("http://")
    s3_host, s3_port = endpoint.rsplit(":", 1)
    home = cluster.workdir / "kfp-home"  # no ~/.kube/config of the machine's is read
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(home),
        "KUBECONFIG": str(cluster.admin_kubeconfig),
        "POD_NAMESPACE": ns,
        "DBCONFIG_MYSQLCONFIG_HOST": database.host,
        "DBCONFIG_MYSQLCONFIG_PORT": str(database.port),
        "DBCONFIG_MYSQLCONFIG_USER": database.user,
        "DBCONFIG_MYSQLCONFIG_PASSWORD": database.password,
        "OBJECTSTORECONFIG_HOST": s3_host,
        "OBJECTSTORECONFIG_PORT": s3_port,
        "OBJECTSTORECONFIG_SECURE": "false",
        "OBJECTSTORECONFIG_REGION": s3_env["AWS_DEFAULT_REGION"],
        "OBJECTSTORECONFIG_BUCKETNAME": bucket,
        "OBJECTSTORECONFIG_ACCESSKEY": s3_env["AWS_ACCESS_KEY_ID"],
        "OBJECTSTORECONFIG_SECRETACCESSKEY": s3_env["AWS_SECRET_ACCESS_KEY"],
        # Read at start; the visualization server is not deployed here.
        "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_HOST": "127.0.0.1",
        "ML_PIPELINE_VISUALIZATIONSERVER_SERVICE_PORT": "1",
        "INITCONNECTIONTIMEOUT": "60s",
    }
    log_path = cluster.workdir / "kfp-apiserver.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [str(kfp_dir / "apiserver"), f"--config={kfp_dir}", f"--rpcPortFlag=:{API_GRPC_PORT}",
             f"--httpPortFlag={address}:{API_HTTP_PORT}", "--logtostderr=true"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    http = f"http://{address}:{API_HTTP_PORT}"
    try:

        def healthy() -> bool:
            if server.poll() is not None:
                raise ClusterStartError(f"KFP's API server exited:\n{log_tail(log_path)}")
            try:
                return requests.get(f"{http}/apis/v2beta1/healthz", timeout=2).ok
            except requests.RequestException:
                return False

        wait_for("KFP's API server", healthy, timeout=120, interval=0.5)
        yield ApiServer(http, log_path)
    finally:
        stop_process(server, timeout=15)


def _persistence_agent_pod() -> dict:
    """KFP's Deployment's pod (manifests/kustomize/base/pipeline), less its image and its
    wait-for-the-API-server init container (the API server is up first here)."""
    token_dir = "/var/run/secrets/kubeflow/tokens"
    command = (
        "persistence-agent --logtostderr=true --namespace=$(NAMESPACE) "
        "--ttlSecondsAfterWorkflowFinish=86400 --numWorker=2 --executionType=Workflow "
        "--logLevel=info"
    )
    return {
        "metadata": {"name": PERSISTENCE_AGENT, "labels": {"app": PERSISTENCE_AGENT}},
        "spec": {
            "serviceAccountName": PERSISTENCE_AGENT,
            "containers": [
                {
                    "name": "ml-pipeline-persistenceagent",
                    "image": "ghcr.io/kubeflow/kfp-persistence-agent:2.17.0",
                    "command": command.split(),
                    "env": [
                        {
                            "name": "NAMESPACE",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        }
                    ],
                    "volumeMounts": [{"name": "persistenceagent-sa-token", "mountPath": token_dir}],
                }
            ],
            "volumes": [
                {
                    "name": "persistenceagent-sa-token",
                    "projected": {
                        "sources": [
                            {
                                "serviceAccountToken": {
                                    "path": "persistenceagent-sa-token",
                                    "expirationSeconds": 3600,
                                    "audience": "pipelines.kubeflow.org",
                                }
                            }
                        ]
                    },
                }
            ],
        },
    }


@contextlib.contextmanager
def start_persistence_agent(cluster: Cluster, kfp_dir: Path) -> Iterator[None]:
    """The persistence agent, which reports the runs' Workflows to the API server (a run's
    state in KFP comes from it), as a pod; deleted on exit."""
    ns = cluster.namespace
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_service_account(ns, {"metadata": {"name": PERSISTENCE_AGENT}})
        role = create_role(api, ns, kfp_dir / "ml-pipeline-persistenceagent-role.yaml")
        bind_role(api, ns, role, PERSISTENCE_AGENT)
        core.create_namespaced_pod(ns, _persistence_agent_pod())
        try:

            def running() -> bool:
                pod = core.read_namespaced_pod(PERSISTENCE_AGENT, ns)
                if pod.status.phase in ("Failed", "Succeeded"):
                    raise ClusterStartError(f"KFP's persistence agent ended: {pod.status}")
                return pod.status.phase == "Running"

            wait_for("KFP's persistence agent", running, timeout=60)
            yield
        finally:
            with contextlib.suppress(client.rest.ApiException):
                core.delete_namespaced_pod(PERSISTENCE_AGENT, ns, grace_period_seconds=5)


@dataclass(frozen=True)
class Kfp:
    api: ApiServer
    mlmd: Mlmd


@contextlib.contextmanager
def start_kfp(
    cluster: Cluster,
    kfp_dir: Path,
    mlmd_venv: Path,
    workdir: Path,
    *,
    s3_env: dict[str, str],
    object_store: str,
) -> Iterator[Kfp]:
    """KFP's backend for the cluster's namespace, over Argo's controller (start_argo):
    what a default install has (:func:`install_pipeline_runtime`), ML Metadata, MariaDB, the
    API server with its pipelines in the bucket ``mlpipeline`` (which must exist) and the
    persistence agent; stopped on exit. ``object_store``: host:9000 where the S3 server of
    ``s3_env`` also answers, at a cluster service address (it becomes seaweedfs.kubeflow)."""
    install_pipeline_runtime(cluster, kfp_dir, s3_env=s3_env, object_store=object_store)
    mlmd_host = service_address(cluster.pod_cidr, MLMD_ADDRESS)
    with contextlib.ExitStack() as stack:
        mlmd = stack.enter_context(
            start_mlmd(mlmd_venv, workdir, host=mlmd_host, web_port=METADATA_ENVOY_PORT)
        )
        with cluster.admin() as api:
            ns = cluster.namespace
            publish(api, ns, "metadata-grpc-service", mlmd_host, {"grpc": MLMD_PORT})
            publish(api, ns, METADATA_ENVOY_SERVICE, mlmd_host, {"web": METADATA_ENVOY_PORT})
        database = stack.enter_context(start_mariadb(workdir))
        server = stack.enter_context(
            start_api_server(cluster, kfp_dir, database, s3_env=s3_env, bucket=KFP_BUCKET)
        )
        stack.enter_context(start_persistence_agent(cluster, kfp_dir))
        yield Kfp(server, mlmd)
