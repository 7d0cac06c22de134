"""Session fixture: a real Kubernetes control plane on 127.0.0.1 plus a process kubelet.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) is one Go
binary built from k8s.io/kubernetes by tests/cluster/build.sh and cached by source hash.
Tests get an admin kubeconfig and one for the elastic-step-master ServiceAccount, bound to
the Role in manifests/rbac.yaml.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import yaml
from k8s_helpers import wait_for
from kubernetes import client, config, utils

REPO = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO / "tests" / "cluster"
NAMESPACE = "elastic-step-test"
SERVICE_ACCOUNT = "elastic-step-master"
NODE_NAME = "process-node-1"
NODE_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20"}
# Each test cluster on this machine claims one 127.N.0.0/16 for its pods and its DNS server
# (127.N.255.53), by holding a lock file for as long as the session runs.
NET_LOCKS = Path("/tmp/elastic-step-cluster-net")


@dataclass(frozen=True)
class Cluster:
    """What the tests get: where the cluster is and who they may talk to it as."""

    admin_kubeconfig: Path
    sa_kubeconfig: Path
    namespace: str
    node_name: str
    node_capacity: dict[str, str]
    workdir: Path
    pod_cidr: str  # pods get addresses from here (127.N.0.0/16)
    dns_address: str  # the cluster DNS server, port 53 UDP and TCP (127.N.255.53)
    pvc_root: Path  # provisioned PersistentVolumes: <pvc_root>/<namespace>/<claim>

    def admin(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.admin_kubeconfig))

    def service_account(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.sa_kubeconfig))


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _build_binary() -> Path:
    result = subprocess.run(
        [str(CLUSTER_DIR / "build.sh")], stdout=subprocess.PIPE, stderr=None, text=True
    )
    if result.returncode != 0:
        pytest.exit(f"building the test control plane failed (exit {result.returncode})", 1)
    return Path(result.stdout.strip().splitlines()[-1])


def pytest_sessionstart(session: pytest.Session) -> None:
    # A cold build takes many minutes; doing it here keeps it out of any test's timeout.
    global _BINARY
    _BINARY = _build_binary()


_BINARY: Path | None = None


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _apply(api: client.ApiClient, manifest: Path, namespace: str | None = None) -> None:
    for doc in yaml.safe_load_all(manifest.read_text()):
        try:
            utils.create_from_dict(api, doc, namespace=namespace)
        except utils.FailToCreateError as err:
            if any(e.status != 409 for e in err.api_exceptions):
                raise


def _write_token_kubeconfig(path: Path, admin_kubeconfig: Path, token: str) -> None:
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]
    user = f"{NAMESPACE}:{SERVICE_ACCOUNT}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": user,
                        "context": {
                            "cluster": cluster["name"],
                            "user": user,
                            "namespace": NAMESPACE,
                        },
                    }
                ],
                "current-context": user,
            }
        )
    )
    path.chmod(0o600)


def _claim_loopback_block() -> tuple[int, IO[str]]:
    """Lock 127.N.0.0/16 for this session; the lock goes when the process does."""
    NET_LOCKS.mkdir(parents=True, exist_ok=True)
    for block in range(1, 255):
        lock = (NET_LOCKS / f"127.{block}.lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        # Something outside this scheme may hold the DNS port: then try the next block.
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((f"127.{block}.255.53", 53))
            return block, lock
        lock.close()
    raise RuntimeError("no free 127.N.0.0/16 block for the test cluster")


def _node_ready(core: client.CoreV1Api) -> bool:
    node = core.read_node(NODE_NAME)
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    # The not-ready taint is lifted by the node lifecycle controller once Ready is seen.
    return ready and not node.spec.taints


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binary = _BINARY or _build_binary()
    workdir = tmp_path_factory.mktemp("k8s")
    plane_dir = workdir / "control-plane"
    started = time.monotonic()
    plane_log = (workdir / "control-plane.log").open("wb")
    plane = subprocess.Popen(
        [str(binary), "up", "--dir", str(plane_dir)],
        stdout=plane_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    kubelet: subprocess.Popen[bytes] | None = None
    addons: subprocess.Popen[bytes] | None = None
    kubelet_log = (workdir / "kubelet.log").open("wb")
    addons_log = (workdir / "addons.log").open("wb")
    block, net_lock = _claim_loopback_block()
    pod_cidr, dns_address = f"127.{block}.0.0/16", f"127.{block}.255.53"
    pvc_root = workdir / "pvc"
    try:

        def ready() -> dict[str, str] | None:
            if plane.poll() is not None:
                raise RuntimeError(f"control plane exited:\n{_tail(workdir / 'control-plane.log')}")
            info = plane_dir / "ready.json"
            return json.loads(info.read_text()) if info.exists() else None

        try:
            info = wait_for("the control plane", ready, timeout=240)
        except (RuntimeError, TimeoutError) as err:
            logs = "\n".join(
                f"--- {p.name}\n{_tail(p)}" for p in sorted((plane_dir / "logs").glob("*.log"))
            )
            pytest.fail(f"{err}\n{logs}")
        admin_kubeconfig = Path(info["admin_kubeconfig"])
        admin = config.new_client_from_config(config_file=str(admin_kubeconfig))
        core = client.CoreV1Api(admin)

        core.create_namespace({"metadata": {"name": NAMESPACE}})
        _apply(admin, REPO / "manifests" / "rbac.yaml", namespace=NAMESPACE)
        _apply(admin, REPO / "manifests" / "priority-classes.yaml")
        # Pods run as the namespace's "default" ServiceAccount, which a controller creates.
        wait_for(
            "the default ServiceAccount",
            lambda: core.read_namespaced_service_account("default", NAMESPACE),
            timeout=60,
        )
        token = core.create_namespaced_service_account_token(
            SERVICE_ACCOUNT, NAMESPACE, {"spec": {"expirationSeconds": 4 * 3600}}
        ).status.token
        sa_kubeconfig = workdir / "elastic-step-master.kubeconfig"
        _write_token_kubeconfig(sa_kubeconfig, admin_kubeconfig, token)

        addons_ready = workdir / "addons.ready"
        addons = subprocess.Popen(
            [
                sys.executable,
                str(CLUSTER_DIR / "addons.py"),
                f"--kubeconfig={admin_kubeconfig}",
                f"--dns-address={dns_address}",
                f"--pvc-root={pvc_root}",
                f"--ready-file={addons_ready}",
            ],
            stdout=addons_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        capacity = ",".join(f"{k}={v}" for k, v in NODE_CAPACITY.items())
        kubelet = subprocess.Popen(
            [
                sys.executable,
                str(CLUSTER_DIR / "kubelet.py"),
                "--kubeconfig",
                str(admin_kubeconfig),
                "--node-name",
                NODE_NAME,
                "--capacity",
                capacity,
                "--workdir",
                str(workdir / "pods"),
                f"--pod-cidr={pod_cidr}",
                f"--cluster-dns={dns_address}",
                f"--pvc-root={pvc_root}",
            ],
            stdout=kubelet_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def addons_up() -> bool:
            if addons.poll() is not None:
                raise RuntimeError(f"cluster add-ons exited:\n{_tail(workdir / 'addons.log')}")
            return addons_ready.exists()

        wait_for("cluster DNS and provisioner", addons_up, timeout=60)
        wait_for("node Ready and untainted", lambda: _node_ready(core), timeout=90)
        print(f"\nKubernetes control plane and kubelet ready in {time.monotonic() - started:.1f}s")
        yield Cluster(
            admin_kubeconfig=admin_kubeconfig,
            sa_kubeconfig=sa_kubeconfig,
            namespace=NAMESPACE,
            node_name=NODE_NAME,
            node_capacity=dict(NODE_CAPACITY),
            workdir=workdir,
            pod_cidr=pod_cidr,
            dns_address=dns_address,
            pvc_root=pvc_root,
        )
    finally:
        if kubelet is not None:
            _stop(kubelet, timeout=30)
        if addons is not None:
            _stop(addons, timeout=10)
        _stop(plane, timeout=60)
        plane_log.close()
        kubelet_log.close()
        addons_log.close()
        net_lock.close()


@pytest.fixture
def admin_api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.admin()
    yield api
    api.close()


@pytest.fixture
def sa_api(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = cluster.service_account()
    yield api
    api.close()


@pytest.fixture(autouse=True)
def _clean_namespace(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with no pods left over in the test namespace."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster: Cluster = request.getfixturevalue("cluster")
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        core.delete_collection_namespaced_pod(cluster.namespace, grace_period_seconds=0)

        def empty() -> bool:
            return not core.list_namespaced_pod(cluster.namespace).items

        wait_for("the test namespace to be empty", empty, timeout=60)
