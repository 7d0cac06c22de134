"""The test cluster's life, for the tests (tests/k8s/conftest.py) and the benchmarks alike: a
real Kubernetes control plane on 127.0.0.1 plus a process kubelet.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) is one Go
binary built from k8s.io/kubernetes by build.sh and cached by source hash. :func:`start_cluster`
starts it with the add-ons (DNS, PVC provisioner) and one kubelet node, creates the namespace
``elastic-step-test`` with the project's Role, and gives an admin kubeconfig and one for the
elastic-step-master ServiceAccount. See README.md here.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from cgroups import node_cpu_usage_ns
from kubernetes import client, config, utils

CLUSTER_DIR = Path(__file__).resolve().parent
REPO = CLUSTER_DIR.parents[1]
NAMESPACE = "elastic-step-test"
SERVICE_ACCOUNT = "elastic-step-master"
NODE_NAME = "process-node-1"
NODE_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20"}
# Each test cluster on this machine claims one 127.N.0.0/16 for its pods and its DNS server
# (127.N.255.53), by holding a lock file for as long as the cluster runs.
NET_LOCKS = Path("/tmp/elastic-step-cluster-net")


PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


class ClusterStartError(RuntimeError):
    """The test cluster could not be built or started; the message says which part and why."""


@dataclass(frozen=True)
class Cluster:
    """Where the cluster is and who one may talk to it as."""

    admin_kubeconfig: Path
    sa_kubeconfig: Path
    namespace: str
    node_name: str
    node_capacity: dict[str, str]
    workdir: Path
    pod_cidr: str  # pods get addresses from here (127.N.0.0/16)
    dns_address: str  # the cluster DNS server, port 53 UDP and TCP (127.N.255.53)
    pvc_root: Path  # provisioned PersistentVolumes: <pvc_root>/<namespace>/<claim>
    kubelet_pid: int

    def cpu_used_s(self) -> float | None:
        """CPU seconds the node's containers have used since it started (its cpuacct group);
        None where the host has no cgroup-v1 cpuacct controller."""
        used = node_cpu_usage_ns(self.node_name, self.kubelet_pid)
        return None if used is None else used / 1e9

    def admin(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.admin_kubeconfig))

    def service_account(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.sa_kubeconfig))


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.2
) -> Any:
    """Poll check() until it returns something truthy; TimeoutError naming ``what`` if not.
    A ClusterStartError from check() (what it waits for has exited) ends the wait at once."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except ClusterStartError:
            raise
        except Exception as err:  # keep polling; report the last error on timeout
            last_error = err
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def container_log(workdir: Path, pod: client.V1Pod, container: str = "main") -> str:
    """What `kubectl logs` would show: the process kubelet keeps it in the pod's directory."""
    meta = pod.metadata
    pod_dir = workdir / "pods" / f"{meta.namespace}_{meta.name}_{meta.uid[:8]}"
    return (pod_dir / f"{container}.log").read_text(errors="replace")


def build_binary() -> Path:
    """The control plane binary (build.sh builds it once per source hash, then answers from
    its cache); needs the Go toolchain ($GO or go on PATH)."""
    return run_build("build.sh", "the test control plane")


def run_build(script: str, what: str) -> Path:
    """Runs one of this directory's cached build scripts; the path it prints last."""
    result = subprocess.run(
        [str(CLUSTER_DIR / script)], stdout=subprocess.PIPE, stderr=None, text=True
    )
    if result.returncode != 0:
        raise ClusterStartError(f"building {what} failed (exit {result.returncode})")
    return Path(result.stdout.strip().splitlines()[-1])


def write_token_kubeconfig(
    path: Path, admin_kubeconfig: Path, namespace: str, user: str, token: str
) -> Path:
    """A kubeconfig for the admin's cluster that authenticates with ``token`` in ``namespace``."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]
    context = {"cluster": cluster["name"], "user": user, "namespace": namespace}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": user, "context": context}],
                "current-context": user,
            }
        )
    )
    path.chmod(0o600)
    return path


def _apply(api: client.ApiClient, manifest: Path, namespace: str | None = None) -> None:
    for doc in yaml.safe_load_all(manifest.read_text()):
        try:
            utils.create_from_dict(api, doc, namespace=namespace)
        except utils.FailToCreateError as err:
            if any(e.status != 409 for e in err.api_exceptions):
                raise


def add_namespace(
    admin_kubeconfig: Path,
    namespace: str,
    kubeconfig: Path,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Creates ``namespace`` (with ``labels``), applies manifests/rbac.yaml in it and writes
    ``kubeconfig``, a 4-hour token of its elastic-step-master ServiceAccount; returns it."""
    with config.new_client_from_config(config_file=str(admin_kubeconfig)) as admin:
        core = client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": namespace, "labels": dict(labels or {})}})
        _apply(admin, REPO / "manifests" / "rbac.yaml", namespace=namespace)
        # Pods run as the namespace's "default" ServiceAccount, which a controller creates.
        wait_for(
            f"the default ServiceAccount of {namespace}",
            lambda: core.read_namespaced_service_account("default", namespace),
            timeout=60,
        )
        token = core.create_namespaced_service_account_token(
            SERVICE_ACCOUNT, namespace, {"spec": {"expirationSeconds": 4 * 3600}}
        ).status.token
    user = f"{namespace}:{SERVICE_ACCOUNT}"
    return write_token_kubeconfig(kubeconfig, admin_kubeconfig, namespace, user, token)


def create_role(api: client.ApiClient, namespace: str, manifest: Path) -> str:
    """Creates the Role of a YAML manifest in ``namespace``; its name."""
    role = yaml.safe_load(manifest.read_text())
    client.RbacAuthorizationV1Api(api).create_namespaced_role(namespace, role)
    return role["metadata"]["name"]


def create_secret(api: client.ApiClient, namespace: str, name: str, data: dict[str, str]) -> None:
    """Creates Secret ``name`` in ``namespace`` holding ``data`` (given as stringData)."""
    client.CoreV1Api(api).create_namespaced_secret(
        namespace, {"metadata": {"name": name}, "stringData": data}
    )


def bind_role(api: client.ApiClient, namespace: str, role: str, account: str) -> None:
    """Binds Role ``role`` to ServiceAccount ``account``, both in ``namespace``."""
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": f"{account}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )


def die_with_parent() -> None:
    """A ``preexec_fn`` for the host servers a test starts: the kernel kills the child when
    the test process dies, killed or not, so none is left holding its ports (SIGKILL: KFP's
    API server outlives a SIGTERM)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def _pod_path(first: Sequence[Path]) -> list[str]:
    path = [str(p) for p in first] + [str(Path(sys.executable).parent)]
    return path + [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p]


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _claim_loopback_block() -> tuple[int, IO[str]]:
    """Lock 127.N.0.0/16 for this cluster; the lock goes when the process does."""
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
    raise ClusterStartError("no free 127.N.0.0/16 block for the test cluster")


def _node_ready(core: client.CoreV1Api) -> bool:
    node = core.read_node(NODE_NAME)
    ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
    # The not-ready taint is lifted by the node lifecycle controller once Ready is seen.
    return ready and not node.spec.taints


@contextlib.contextmanager
def start_cluster(
    workdir: Path,
    binary: Path | None = None,
    *,
    pod_path: Sequence[Path] = (),
    host_paths: Sequence[Path] = (),
    node_capacity: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """Starts the control plane, the add-ons and one kubelet with their files and logs under
    ``workdir``; stops them all (and so every pod's processes) on exit. ``binary``: the
    control plane, from :func:`build_binary` (built now when None). Pods find commands on
    ``pod_path``, then in this interpreter's bin directory (``elastic-step``, as in the
    image), then on this process's PATH. Each container has its own /tmp, but sees
    ``host_paths`` (a test session's directory, where it hands pods their files) at their
    paths. ``node_capacity`` overrides entries of the node's capacity (a bench's "cpu": what
    the scheduler may place; the kubelet enforces each pod's CPU limit). Raises
    ClusterStartError, with the logs' tails,
    when a part does not come up."""
    binary = binary or build_binary()
    plane_dir = workdir / "control-plane"
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
    net_lock: IO[str] | None = None
    try:
        block, net_lock = _claim_loopback_block()
        pod_cidr, dns_address = f"127.{block}.0.0/16", f"127.{block}.255.53"
        pvc_root = workdir / "pvc"

        def ready() -> dict[str, str] | None:
            if plane.poll() is not None:
                raise ClusterStartError(
                    f"control plane exited:\n{log_tail(workdir / 'control-plane.log')}"
                )
            info = plane_dir / "ready.json"
            return json.loads(info.read_text()) if info.exists() else None

        try:
            info = wait_for("the control plane", ready, timeout=240)
        except (ClusterStartError, TimeoutError) as err:
            logs = "\n".join(
                f"--- {p.name}\n{log_tail(p)}" for p in sorted((plane_dir / "logs").glob("*.log"))
            )
            raise ClusterStartError(f"{err}\n{logs}") from err
        admin_kubeconfig = Path(info["admin_kubeconfig"])
        with config.new_client_from_config(config_file=str(admin_kubeconfig)) as admin:
            _apply(admin, REPO / "manifests" / "priority-classes.yaml")
            # As shipped: the master's account writes only elastic-step's objects.
            _apply(admin, REPO / "manifests" / "admission-policy.yaml")
        sa_kubeconfig = add_namespace(
            admin_kubeconfig, NAMESPACE, workdir / "elastic-step-master.kubeconfig"
        )

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
        node = {**NODE_CAPACITY, **(node_capacity or {})}
        capacity = ",".join(f"{k}={v}" for k, v in node.items())
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
                *(f"--host-path={path}" for path in host_paths),
            ],
            stdout=kubelet_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PATH": os.pathsep.join(_pod_path(pod_path))},
        )

        def addons_up() -> bool:
            if addons.poll() is not None:
                log = log_tail(workdir / "addons.log")
                raise ClusterStartError(f"cluster add-ons exited:\n{log}")
            return addons_ready.exists()

        with config.new_client_from_config(config_file=str(admin_kubeconfig)) as admin:
            core = client.CoreV1Api(admin)
            try:
                wait_for("cluster DNS and provisioner", addons_up, timeout=60)
                wait_for("node Ready and untainted", lambda: _node_ready(core), timeout=90)
            except TimeoutError as err:
                log = log_tail(workdir / "kubelet.log")
                raise ClusterStartError(f"{err}\n--- kubelet.log\n{log}") from err
        yield Cluster(
            admin_kubeconfig=admin_kubeconfig,
            sa_kubeconfig=sa_kubeconfig,
            namespace=NAMESPACE,
            node_name=NODE_NAME,
            node_capacity=node,
            workdir=workdir,
            pod_cidr=pod_cidr,
            dns_address=dns_address,
            pvc_root=pvc_root,
            kubelet_pid=kubelet.pid,
        )
    finally:
        if kubelet is not None:
            stop_process(kubelet, timeout=30)
        if addons is not None:
            stop_process(addons, timeout=10)
        stop_process(plane, timeout=60)
        plane_log.close()
        kubelet_log.close()
        addons_log.close()
        if net_lock is not None:
            net_lock.close()
