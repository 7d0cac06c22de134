"""Kubeflow Pipelines 2.17.0's own backend on the test control plane, beside Argo's
controller (argo.py): the one way the KFP tests start it.

:func:`build_kfp` builds the API server, the persistence agent, the v2 driver and launcher
from the release's source (``build_kfp.sh``, cached). :func:`start_mariadb` runs Debian's
MariaDB server on loopback with a data directory of its own (KFP's stores speak MySQL's
dialect only), and :func:`start_api_server` runs KFP's API server as a host process, as
KFP's own development setup runs it: its config from ``config.json`` and the environment,
the cluster through the admin kubeconfig, its pipelines in a bucket of the S3 server, its
Workflows in the test namespace.
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
from kubernetes import client, utils
from local_cluster import Cluster, ClusterStartError, log_tail, run_build, stop_process, wait_for

#: The ServiceAccount KFP runs pipelines as (DEFAULTPIPELINERUNNERSERVICEACCOUNT).
PIPELINE_RUNNER = "pipeline-runner"


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


@dataclass(frozen=True)
class ApiServer:
    http: str  # http://127.0.0.1:PORT, what kfp.Client(host=...) takes
    grpc_port: int
    log: Path


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
    Needs Argo's CRDs installed; creates the ServiceAccount that runs pipelines and KFP's
    ScheduledWorkflow CRD."""
    ns = cluster.namespace
    with cluster.admin() as api:
        with contextlib.suppress(utils.FailToCreateError):  # installed already
            utils.create_from_yaml(api, str(kfp_dir / "scheduled-workflow-crd.yaml"))
        with contextlib.suppress(client.rest.ApiException):  # made already
            client.CoreV1Api(api).create_namespaced_service_account(
                ns, {"metadata": {"name": PIPELINE_RUNNER}}
            )
    endpoint = s3_env["AWS_ENDPOINT_URL"].removeprefix("http://")
    s3_host, s3_port = endpoint.rsplit(":", 1)
    grpc_port, http_port = free_port(), free_port()
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
            [str(kfp_dir / "apiserver"), f"--config={kfp_dir}", f"--rpcPortFlag=:{grpc_port}",
             f"--httpPortFlag=127.0.0.1:{http_port}", "--logtostderr=true"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    http = f"http://127.0.0.1:{http_port}"
    try:

        def healthy() -> bool:
            if server.poll() is not None:
                raise ClusterStartError(f"KFP's API server exited:\n{log_tail(log_path)}")
            try:
                return requests.get(f"{http}/apis/v2beta1/healthz", timeout=2).ok
            except requests.RequestException:
                return False

        wait_for("KFP's API server", healthy, timeout=120, interval=0.5)
        yield ApiServer(http, grpc_port, log_path)
    finally:
        stop_process(server, timeout=15)
