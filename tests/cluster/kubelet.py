"""A kubelet that runs pods as local processes, for tests against a real control plane.

It registers a Node with a fixed capacity, keeps it Ready (status heartbeat and Lease),
watches the pods the scheduler binds to it, and runs each container's command as a local
process, reporting status through the API the way the real kubelet does:
Pending -> Running -> Succeeded/Failed. A deleted pod (by a user, the garbage collector, an
eviction or a preemption) gets SIGTERM, SIGKILL after its grace period, and then the final
delete with grace 0, which only a kubelet issues.

What a pod gets, so that in-cluster code runs unchanged:

- its own IP, allocated from --pod-cidr (a block of 127.0.0.0/8, so all traffic stays on
  loopback) and never one of a live pod: status.podIP(s), the downward API, /etc/hosts.
  Pods share the host's network namespace: a pod must listen on its own IP (or port 0);
- per container, a mount namespace and a UTS namespace (podinit.py): hostname = the pod's
  hostname, a kubelet-managed /etc/hosts and /etc/resolv.conf (cluster DNS, search path
  <ns>.svc.<domain> svc.<domain> <domain>, ndots:5), /etc/hostname, and the pod's volumes
  (podvolumes.py) at their mount paths, including the ServiceAccount token volume the
  apiserver's admission adds (a real TokenRequest bound to the pod) at
  /var/run/secrets/kubernetes.io/serviceaccount;
- KUBERNETES_SERVICE_HOST/PORT naming the apiserver's loopback address, so
  kubernetes.config.load_incluster_config() works;
- cgroups (v1, cgroups.py) per container: resources.limits.memory as its memory limit (a
  kill by the kernel's OOM killer is reported as reason OOMKilled, as a real runtime does),
  resources.limits.cpu as its CFS quota, and cpuacct counting the CPU time it uses;
- readiness probes deciding the Ready condition (and so the pod's place in EndpointSlices),
  restartPolicy OnFailure/Always with restartCount and lastState, init containers.

See README.md for the limits (one network namespace, the host's files visible, ...).

Run: python tests/cluster/kubelet.py --kubeconfig admin.kubeconfig --node-name node-1
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

# Run as a script: its sibling modules are importable from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cgroups import ContainerGroups, NodeCgroups, kubelet_group
from host_services import service_range
from podenv import (
    HOST_IP,
    container_argv,
    container_env,
    hosts_file,
    parse_quantity,
    pod_hostname,
    resolv_conf,
    service_env,
)
from podvolumes import (
    PodVolumes,
    VolumeNotReady,
    config_map_bytes,
    container_mounts,
    decode_secret,
    prepare_volumes,
    refresh_token,
)

log = logging.getLogger("process-kubelet")

DEFAULT_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20", "ephemeral-storage": "10Gi"}
# Variables a process needs to run at all on this machine; real pods get only their own env.
HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
HEARTBEAT_SECONDS = 5
LEASE_SECONDS = 40
# How long a pod may wait for what its volumes need (a Secret, the kube-root-ca.crt
# ConfigMap, a bound claim) before it fails with StartError. The real kubelet waits forever.
VOLUME_WAIT_SECONDS = 120
# Restart backoff for restartPolicy Always/OnFailure: 1 s doubling to 10 s (real: 10 s to 5 min).
BACKOFF_FIRST, BACKOFF_MAX = 1.0, 10.0
PODINIT = Path(__file__).resolve().parent / "podinit.py"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- pod addresses -------------------------------------------------------------------------


class IPAllocator:
    """Pod IPs from a loopback block, round-robin so an address is not soon reused. A block
    larger than a /24 keeps its last /24 for the cluster's service addresses (its DNS server,
    and the host processes that tests publish as Services): no pod gets one."""

    def __init__(self, cidr: str, reserved: set[str] | None = None):
        self.network = ipaddress.IPv4Network(cidr)
        if not self.network.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"--pod-cidr {cidr} is not inside 127.0.0.0/8")
        self.reserved = {ipaddress.IPv4Address(a) for a in reserved or ()}
        self.services = service_range(cidr)
        self.in_use: set[ipaddress.IPv4Address] = set()
        self.next = 1
        self.lock = threading.Lock()

    def allocate(self) -> str:
        size = self.network.num_addresses
        with self.lock:
            for _ in range(size):
                offset, self.next = self.next, self.next + 1 if self.next + 1 < size - 1 else 1
                address = self.network[offset]
                last = int(address) & 0xFF
                if address in self.in_use or address in self.reserved or last in (0, 255):
                    continue
                if self.services is not None and address in self.services:
                    continue
                self.in_use.add(address)
                return str(address)
        raise RuntimeError(f"no free pod IP in {self.network}")

    def release(self, address: str) -> None:
        with self.lock:
            self.in_use.discard(ipaddress.IPv4Address(address))


# --- containers and pods -------------------------------------------------------------------


@dataclass
class Probe:
    """A container's readinessProbe: tcpSocket, httpGet or exec, with the API's defaults."""

    spec: dict[str, Any]
    next_at: float
    ready: bool = False
    successes: int = 0
    failures: int = 0
    busy: bool = False

    @classmethod
    def create(cls, spec: dict[str, Any] | None) -> Probe | None:
        if not spec:
            return None
        return cls(spec, time.monotonic() + float(spec.get("initialDelaySeconds") or 0))

    def record(self, ok: bool) -> None:
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold") or 1):
                self.ready = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold") or 3):
                self.ready = False
        self.next_at = time.monotonic() + float(self.spec.get("periodSeconds") or 10)
        self.busy = False


@dataclass
class Container:
    """One container of a pod, running as a local process group in its own namespaces."""

    name: str
    image: str
    spec: dict[str, Any]
    init: bool = False
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    message: str = ""
    cgroups: ContainerGroups = field(default_factory=ContainerGroups)
    error_file: Path | None = None
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    waiting_reason: str = "ContainerCreating"
    restart_at: float | None = None  # monotonic time of a pending restart
    readiness: Probe | None = None
    env: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def running(self) -> bool:
        return self.proc is not None and self.exit_code is None

    def ready(self) -> bool:
        return self.running() and (self.readiness is None or self.readiness.ready)

    def poll(self) -> bool:
        """True once the container has terminated; records how it ended."""
        with self.lock:
            if self.exit_code is not None:
                return True
            if self.proc is None:
                return False
            code = self.proc.poll()
            if code is None:
                return False
            # The container ends with its main process: kill what is left of it.
            self.kill_group(signal.SIGKILL)
            self.cgroups.kill_all()
            self.finished_at = now()
            oom = self.cgroups.oom_kills() > 0
            start_error = ""
            if self.error_file is not None:
                with contextlib.suppress(OSError):
                    start_error = self.error_file.read_text(errors="replace").strip()
            if start_error and code == 128:
                self.exit_code, self.reason, self.message = 128, "StartError", start_error
            elif code < 0:
                self.signal, self.exit_code = -code, 128 - code
                self.reason = "OOMKilled" if oom else "Error"
            else:
                self.exit_code = code
                self.reason = "Completed" if code == 0 else ("OOMKilled" if oom else "Error")
            if not self.cgroups.remove(attempts=3):
                log.debug("cgroups %s still busy; removed with the pod", self.cgroups.paths)
            return True

    def fail_to_start(self, message: str) -> None:
        self.started_at = self.finished_at = now()
        self.exit_code, self.reason, self.message = 128, "StartError", message

    def kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminated(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at or None,
            "finishedAt": self.finished_at,
            "containerID": self.container_id(),
        }
        if self.signal:
            state["signal"] = self.signal
        if self.message:
            state["message"] = self.message
        return state

    def container_id(self) -> str:
        return f"process://{self.proc.pid}" if self.proc else ""

    def reset_for_restart(self) -> None:
        self.last_terminated = self.terminated()
        self.restart_count += 1
        self.proc = None
        self.exit_code = self.signal = None
        self.reason = self.message = self.started_at = self.finished_at = ""
        self.restart_at = None
        self.readiness = None

    def status(self) -> dict[str, Any]:
        state: dict[str, Any]
        running = self.running()
        if running:
            state = {"running": {"startedAt": self.started_at}}
        elif self.exit_code is not None and self.restart_at is None:
            state = {"terminated": self.terminated()}
        else:
            reason = "CrashLoopBackOff" if self.restart_at is not None else self.waiting_reason
            state = {"waiting": {"reason": reason}}
        last = {"terminated": self.last_terminated} if self.last_terminated else {}
        if self.restart_at is not None and self.exit_code is not None:
            last = {"terminated": self.terminated()}
        return {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": self.container_id(),
            "ready": self.ready() and not self.init,
            "started": running,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": last,
        }


@dataclass
class PodRun:
    """The kubelet's record of one pod it has started."""

    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    pod_dir: Path
    containers: list[Container]
    init_containers: list[Container]
    started_at: str
    ip: str = ""
    stage: str = "starting"  # starting -> init -> running
    failed: bool = False  # the pod cannot run (init container or volume failure)
    terminating: bool = False
    reported_terminal: bool = False
    released: bool = False
    volumes: PodVolumes = field(default_factory=PodVolumes)
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_status: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def restart_policy(self) -> str:
        return self.pod["spec"].get("restartPolicy") or "Always"

    def done(self) -> bool:
        """No container runs and none will be (re)started."""
        if self.failed:
            return all(c.poll() or c.proc is None for c in self.containers + self.init_containers)
        if self.stage != "running":
            return False
        return all(c.poll() and c.restart_at is None for c in self.containers)

    def phase(self) -> str:
        if self.failed:
            return "Failed"
        if self.stage != "running":
            return "Pending"
        if not self.done():
            return "Running"
        return "Succeeded" if all(c.exit_code == 0 for c in self.containers) else "Failed"

    def wants_restart(self, container: Container) -> bool:
        if self.terminating or container.exit_code is None or container.reason == "StartError":
            return False
        policy = self.restart_policy
        return policy == "Always" or (policy == "OnFailure" and container.exit_code != 0)


class ProcessKubelet:
    """Registers one Node and runs the pods bound to it as local processes."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        capacity: dict[str, str],
        workdir: Path,
        base_env: dict[str, str] | None = None,
        pod_cidr: str = "127.1.0.0/16",
        cluster_dns: str = "",
        cluster_domain: str = "cluster.local",
        pvc_root: Path | None = None,
        host_paths: list[str] | None = None,
    ) -> None:
        """``host_paths``: host paths that every container sees at their paths even under
        /tmp (beside the interpreter and the repository): a test's own directory."""
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.node_name = node_name
        self.capacity = capacity
        self.workdir = workdir
        self.base_env = base_env if base_env is not None else _host_env()
        self.host_paths = _host_paths(self.base_env) + list(host_paths or [])
        #: The tests' own directories: writable in every container, even under a read-only root.
        self.shared_paths = list(host_paths or [])
        server = urlsplit(api.configuration.host)
        self.service_env = service_env(server.hostname or HOST_IP, server.port or 443)
        self.pod_cidr = pod_cidr
        self.ips = IPAllocator(pod_cidr, reserved={cluster_dns} if cluster_dns else None)
        self.cluster_dns = cluster_dns
        self.cluster_domain = cluster_domain
        self.pvc_root = pvc_root or workdir.parent / "pvc"
        self.cgroups = NodeCgroups(kubelet_group(node_name, os.getpid()))
        self.runs: dict[str, PodRun] = {}
        self.runs_lock = threading.Lock()
        self.stopping = threading.Event()
        self.node_uid = ""
        self.ready_since = now()  # conditions keep their transition time across heartbeats

    # --- node ---------------------------------------------------------------------------

    def register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": labels},
            "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]},
        }
        try:
            node = self.core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
            node = self.core.read_node(self.node_name)
        self.node_uid = node.metadata.uid
        self._node_status()
        log.info("node %s registered with capacity %s", self.node_name, self.capacity)

    def _node_status(self) -> None:
        stamp = now()

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": self.ready_since,
            }

        status = {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                condition("Ready", "True", "KubeletReady", "process kubelet is posting ready"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": HOST_IP},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self.node_name,
                "systemUUID": self.node_name,
                "bootID": str(os.getpid()),
                "kernelVersion": os.uname().release,
                "osImage": "process-kubelet",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": "v1.35.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.core.patch_node_status(self.node_name, {"status": status})

    def _renew_lease(self) -> None:
        # The node lifecycle controller judges health by this Lease.
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.node_name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": self.node_uid,
                    }
                ],
            },
            "spec": {
                "holderIdentity": self.node_name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_micro(),
            },
        }
        try:
            self.coordination.patch_namespaced_lease(
                self.node_name, "kube-node-lease", {"spec": body["spec"]}
            )
        except ApiException as err:
            if err.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", body)

    def _heartbeat_loop(self) -> None:
        parent = os.getppid()
        while not self.stopping.wait(HEARTBEAT_SECONDS):
            if os.getppid() != parent:  # the test run died without stopping us
                self.stop()
                return
            try:
                self._renew_lease()
                self._node_status()
                self._refresh_tokens()
            except Exception:
                log.exception("heartbeat failed")

    def _refresh_tokens(self) -> None:
        with self.runs_lock:
            runs = list(self.runs.values())
        stamp = time.time()
        for run in runs:
            for token in run.volumes.tokens:
                if not run.terminating and token.due(stamp):
                    refresh_token(token, run.pod, self, stamp)
                    log.info("refreshed token %s of %s/%s", token.path, run.namespace, run.name)

    # --- pods ---------------------------------------------------------------------------

    def _list_pods(self) -> tuple[list[dict[str, Any]], str]:
        resp = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _preload_content=False
        )
        data = json.loads(resp.data)
        return data["items"], data["metadata"]["resourceVersion"]

    def _watch_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                pods, version = self._list_pods()
                seen = set()
                for pod in pods:
                    seen.add(pod["metadata"]["uid"])
                    self.sync(pod)
                with self.runs_lock:
                    gone = [run for uid, run in self.runs.items() if uid not in seen]
                for run in gone:
                    self._terminate(run, grace=0, finalize=False)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=f"spec.nodeName={self.node_name}",
                    resource_version=version,
                    timeout_seconds=30,
                    allow_watch_bookmarks=True,
                )
                for event in stream:
                    if self.stopping.is_set():
                        return
                    pod = event["raw_object"]
                    if event["type"] == "DELETED":
                        self._on_deleted(pod)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        self.sync(pod)
            except ApiException as err:
                # 410 Gone: our resourceVersion is too old; relist and watch again.
                if err.status != 410:
                    log.warning("pod watch failed: %s", err)
                    time.sleep(1)
            except Exception:
                log.exception("pod watch failed")
                time.sleep(1)

    def sync(self, pod: dict[str, Any]) -> None:
        """Bring the local processes in line with one pod object."""
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        with self.runs_lock:
            run = self.runs.get(uid)
        if meta.get("deletionTimestamp"):
            if run is None:
                self._finalize(meta)
            elif not run.terminating:
                grace = meta.get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
                with run.lock:
                    run.terminating = True
                threading.Thread(
                    target=self._terminate, args=(run, int(grace)), daemon=True
                ).start()
            return
        if run is not None:
            return
        phase = status.get("phase", "Pending")
        if phase in ("Succeeded", "Failed"):
            return
        if phase == "Running":
            # Started by an earlier kubelet process whose children are gone.
            self._patch_status(meta, {"phase": "Failed", "reason": "ProcessLost"})
            return
        spec = pod["spec"]
        pod_dir = self.workdir / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"

        def record(spec_container: dict[str, Any], init: bool) -> Container:
            return Container(
                spec_container["name"], spec_container.get("image", ""), spec_container, init
            )

        run = PodRun(
            uid=uid,
            namespace=meta["namespace"],
            name=meta["name"],
            pod=pod,
            pod_dir=pod_dir,
            containers=[record(c, False) for c in spec["containers"]],
            init_containers=[record(c, True) for c in spec.get("initContainers") or []],
            started_at=now(),
        )
        if run.init_containers:
            for container in run.containers:
                container.waiting_reason = "PodInitializing"
        with self.runs_lock:
            self.runs[uid] = run
        threading.Thread(target=self._start_pod, args=(run,), daemon=True).start()

    # --- starting -----------------------------------------------------------------------

    def _start_pod(self, run: PodRun) -> None:
        try:
            self._prepare_pod(run)
        except Exception as err:  # the pod fails, the kubelet carries on
            log.exception("pod %s/%s cannot start", run.namespace, run.name)
            with run.lock:
                run.failed = True
                for container in run.init_containers + run.containers:
                    if container.proc is None and container.exit_code is None:
                        container.fail_to_start(str(err))
            self._report(run)
            return
        if run.failed or run.terminating:
            self._report(run)
            return
        self._run_init_containers(run)
        with run.lock:
            if run.failed or run.terminating:
                return
            run.stage = "running"
            for container in run.containers:
                self._spawn(run, container)
        pids = [c.proc.pid for c in run.containers if c.proc]
        log.info("started pod %s/%s ip %s pids %s", run.namespace, run.name, run.ip, pids)
        self._report(run)

    def _prepare_pod(self, run: PodRun) -> None:
        """The pod's sandbox: directory, IP, hosts/resolv.conf, volumes."""
        spec = run.pod["spec"]
        run.pod_dir.mkdir(parents=True, exist_ok=True)
        host_network = bool(spec.get("hostNetwork"))
        run.ip = HOST_IP if host_network else self.ips.allocate()
        run.pod["status"] = {
            "podIP": run.ip,
            "podIPs": [{"ip": run.ip}],
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
        }
        etc = run.pod_dir / "etc"
        etc.mkdir(exist_ok=True)
        if not host_network:
            (etc / "hosts").write_text(hosts_file(run.pod, run.ip, self.cluster_domain))
            (etc / "hostname").write_text(pod_hostname(run.pod) + "\n")
        host_resolv = ""
        with contextlib.suppress(OSError):
            host_resolv = Path("/etc/resolv.conf").read_text()
        nameserver = self.cluster_dns
        resolv = (
            resolv_conf(run.pod, nameserver, self.cluster_domain, host_resolv)
            if nameserver
            else None
        )
        if resolv is not None:
            (etc / "resolv.conf").write_text(resolv)
        self._report(run)  # Pending, with the pod's IP, containers ContainerCreating

        deadline = time.monotonic() + VOLUME_WAIT_SECONDS
        delay = 0.2
        while True:
            try:
                run.volumes = prepare_volumes(run.pod, run.pod_dir, self, time.time)
                return
            except (VolumeNotReady, ApiException) as err:
                message = err.reason if isinstance(err, ApiException) else str(err)
                if run.terminating or self.stopping.is_set():
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"volumes not ready after {VOLUME_WAIT_SECONDS}s: {message}"
                    ) from err
                log.info("pod %s/%s waits for its volumes: %s", run.namespace, run.name, message)
                for container in run.init_containers + run.containers:
                    container.message = message
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _run_init_containers(self, run: PodRun) -> None:
        """Run init containers one after another; a failure fails the pod under Never."""
        if not run.init_containers:
            return
        with run.lock:
            run.stage = "init"
        for container in run.init_containers:
            while True:
                with run.lock:
                    if run.terminating or self.stopping.is_set():
                        return
                    self._spawn(run, container)
                self._report(run)
                while not container.poll():
                    if run.terminating or self.stopping.wait(0.1):
                        return
                if container.exit_code == 0:
                    break
                if run.restart_policy == "Never" or container.reason == "StartError":
                    with run.lock:
                        run.failed = True
                        for main in run.containers:
                            main.waiting_reason = "PodInitializing"
                    self._report(run)
                    return
                delay = min(BACKOFF_FIRST * 2**container.restart_count, BACKOFF_MAX)
                container.restart_at = time.monotonic() + delay
                self._report(run)
                if self.stopping.wait(delay) or run.terminating:
                    return
                container.reset_for_restart()

    def _spawn(self, run: PodRun, container: Container) -> None:
        """Start one container through podinit.py; a failure to set it up is a StartError."""
        spec, name = container.spec, container.name
        try:
            base = {**self.base_env, **self.service_env}
            env = container_env(run.pod, spec, base, self._lookup)
            argv = container_argv(spec, env)
            mounts = container_mounts(run.pod, spec, run.volumes, env)
            etc = run.pod_dir / "etc"
            for file in ("hosts", "hostname", "resolv.conf"):
                if (etc / file).exists():
                    mounts.append({"source": str(etc / file), "target": f"/etc/{file}"})
            limits = (spec.get("resources") or {}).get("limits") or {}
            container.cgroups = self.cgroups.create(
                f"{run.uid[:8]}-{name}-{container.restart_count}",
                memory_bytes=int(parse_quantity(limits["memory"])) if "memory" in limits else None,
                cpu_cores=float(parse_quantity(limits["cpu"])) if "cpu" in limits else None,
            )
            rootfs = run.pod_dir / f"rootfs-{name}"
            rootfs.mkdir(exist_ok=True)
            private_tmp = run.pod_dir / f"tmp-{name}"
            private_tmp.mkdir(exist_ok=True)
            private_tmp.chmod(0o1777)
            container.error_file = run.pod_dir / f"{name}.start-error"
            container.error_file.unlink(missing_ok=True)
            host_network = bool(run.pod["spec"].get("hostNetwork"))
            container.env = env
            plan = {
                "root": str(rootfs),
                "cgroup_procs": container.cgroups.procs_files(),
                "hostname": "" if host_network else pod_hostname(run.pod),
                "mounts": mounts,
                "cwd": spec.get("workingDir") or str(run.pod_dir),
                "private_tmp": str(private_tmp),
                "keep": [*self.host_paths, str(run.pod_dir)],
                "shared": self.shared_paths,
                "argv": argv,
                "env": env,
                "error_file": str(container.error_file),
                "read_only_root": bool(
                    (spec.get("securityContext") or {}).get("readOnlyRootFilesystem")
                ),
                **run_as(run.pod["spec"], spec),
            }
            plan_file = run.pod_dir / f"{name}.plan.json"
            plan_file.write_text(json.dumps(plan))
            plan_file.chmod(0o600)
            container.started_at = now()
            with (run.pod_dir / f"{name}.log").open("ab") as logfile:
                container.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(PODINIT), str(plan_file)],
                    env={},
                    cwd=run.pod_dir,
                    stdin=subprocess.DEVNULL,
                    stdout=logfile,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group: kill reaches children
                )
            if not container.init:
                container.readiness = Probe.create(spec.get("readinessProbe"))
        except (OSError, ValueError, ApiException) as err:
            message = err.reason if isinstance(err, ApiException) else str(err)
            container.fail_to_start(message)
            container.cgroups.remove()

    def _lookup(
        self, kind: str, namespace: str, name: str, key: str | None
    ) -> dict[str, str] | str | None:
        try:
            if kind == "configMap":
                data = self.core.read_namespaced_config_map(name, namespace).data or {}
            else:
                raw = self.core.read_namespaced_secret(name, namespace).data or {}
                data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return data if key is None else data.get(key)

    # --- volume sources (podvolumes.VolumeSources) -------------------------------------

    def _read_raw(self, call: Any, *args: Any) -> dict[str, Any] | None:
        try:
            return json.loads(call(*args, _preload_content=False).data)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._read_raw(self.core.read_namespaced_config_map, name, namespace)
        return None if obj is None else config_map_bytes(obj.get("data"), obj.get("binaryData"))

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None:
        obj = self._read_raw(self.core.read_namespaced_secret, name, namespace)
        return None if obj is None else decode_secret(obj.get("data"))

    def token(self, pod: dict[str, Any], audience: str | None, seconds: int) -> tuple[str, float]:
        meta = pod["metadata"]
        spec: dict[str, Any] = {
            "expirationSeconds": max(seconds, 600),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        account = pod["spec"].get("serviceAccountName") or "default"
        resp = self.core.create_namespaced_service_account_token(
            account, meta["namespace"], {"spec": spec}
        )
        return resp.status.token, resp.status.expiration_timestamp.timestamp()

    def claim_path(self, namespace: str, claim: str) -> Path:
        pvc = self._read_raw(self.core.read_namespaced_persistent_volume_claim, claim, namespace)
        if pvc is None:
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
        volume = (pvc.get("spec") or {}).get("volumeName")
        if not volume or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeNotReady(f'persistentvolumeclaim "{claim}" is not bound')
        pv = self._read_raw(self.core.read_persistent_volume, volume) or {}
        spec = pv.get("spec") or {}
        path = (spec.get("hostPath") or {}).get("path") or (spec.get("local") or {}).get("path")
        target = Path(path) if path else self.pvc_root / namespace / claim
        target.mkdir(parents=True, exist_ok=True)
        return target

    # --- running ------------------------------------------------------------------------

    def _reap_loop(self) -> None:
        # Containers that end by themselves: restart them, or make the pod Succeeded/Failed.
        while not self.stopping.wait(0.2):
            with self.runs_lock:
                runs = list(self.runs.values())
            for run in runs:
                try:
                    self._tend(run)
                except Exception:
                    log.exception("pod %s/%s", run.namespace, run.name)

    def _tend(self, run: PodRun) -> None:
        if run.terminating or run.reported_terminal or run.stage != "running":
            return
        with run.lock:
            for container in run.containers:
                if not container.poll():
                    continue
                if container.restart_at is None and run.wants_restart(container):
                    delay = min(BACKOFF_FIRST * 2**container.restart_count, BACKOFF_MAX)
                    container.restart_at = time.monotonic() + delay
                    log.info(
                        "container %s of %s/%s exited %s; restart in %.0fs",
                        container.name,
                        run.namespace,
                        run.name,
                        container.exit_code,
                        delay,
                    )
                elif container.restart_at is not None and time.monotonic() >= container.restart_at:
                    container.reset_for_restart()
                    self._spawn(run, container)
        self._report(run)
        if run.reported_terminal:
            self._release(run)

    def _report(self, run: PodRun) -> None:
        with run.lock:
            if run.reported_terminal:
                return
            phase = run.phase()
            all_ready = phase == "Running" and all(c.ready() for c in run.containers)
            ready = "True" if all_ready and not run.terminating else "False"
            wanted = {
                "PodReadyToStartContainers": "True" if run.ip else "False",
                "Initialized": "True" if run.stage == "running" else "False",
                "ContainersReady": ready,
                "Ready": ready,
            }
            stamp = now()
            for kind, value in wanted.items():
                if run.conditions.get(kind, ("", ""))[0] != value:
                    run.conditions[kind] = (value, stamp)
            conditions = [
                {"type": kind, "status": value, "lastTransitionTime": since}
                for kind, (value, since) in run.conditions.items()
            ]
            if run.stage != "running" and run.init_containers:
                for condition in conditions:
                    if condition["type"] == "Initialized" and condition["status"] == "False":
                        condition["reason"] = "ContainersNotInitialized"
            status: dict[str, Any] = {
                "phase": phase,
                "hostIP": HOST_IP,
                "hostIPs": [{"ip": HOST_IP}],
                "startTime": run.started_at,
                "conditions": conditions,
                "containerStatuses": [c.status() for c in run.containers],
            }
            if run.ip:
                status["podIP"] = run.ip
                status["podIPs"] = [{"ip": run.ip}]
            if run.init_containers:
                status["initContainerStatuses"] = [c.status() for c in run.init_containers]
            text = json.dumps(status, sort_keys=True)
            if text == run.last_status:
                return
            meta = {"namespace": run.namespace, "name": run.name, "uid": run.uid}
            if self._patch_status(meta, status):
                run.last_status = text
                if phase in ("Succeeded", "Failed"):
                    run.reported_terminal = True
                    log.info("pod %s/%s %s", run.namespace, run.name, phase)

    def _patch_status(self, meta: dict[str, Any], status: dict[str, Any]) -> bool:
        body = {"metadata": {"uid": meta["uid"]}, "status": status}
        try:
            self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body)
            return True
        except ApiException as err:
            if err.status in (404, 409, 422):
                return False  # the pod is gone or replaced by a newer one with the same name
            raise

    # --- readiness probes -------------------------------------------------------------

    def _probe_loop(self) -> None:
        while not self.stopping.wait(0.1):
            with self.runs_lock:
                runs = list(self.runs.values())
            stamp = time.monotonic()
            for run in runs:
                if run.terminating or run.stage != "running":
                    continue
                for container in run.containers:
                    probe = container.readiness
                    if probe and not probe.busy and probe.next_at <= stamp and container.running():
                        probe.busy = True
                        threading.Thread(
                            target=self._probe, args=(run, container, probe), daemon=True
                        ).start()

    def _probe(self, run: PodRun, container: Container, probe: Probe) -> None:
        spec = probe.spec
        timeout = float(spec.get("timeoutSeconds") or 1)
        ok = False
        try:
            if "exec" in spec:
                ok = self._probe_exec(container, spec["exec"].get("command") or [], timeout)
            elif "tcpSocket" in spec:
                port = _port(container.spec, spec["tcpSocket"]["port"])
                host = spec["tcpSocket"].get("host") or run.ip
                with socket.create_connection((host, port), timeout=timeout):
                    ok = True
            elif "httpGet" in spec:
                ok = _probe_http(spec["httpGet"], container.spec, run.ip, timeout)
            else:  # gRPC probes are not implemented: count as passing
                ok = True
        except (OSError, ValueError, subprocess.SubprocessError, http.client.HTTPException):
            ok = False
        before = probe.ready
        probe.record(ok)
        if probe.ready != before:
            log.info(
                "%s/%s container %s ready=%s", run.namespace, run.name, container.name, probe.ready
            )

    @staticmethod
    def _probe_exec(container: Container, command: list[str], timeout: float) -> bool:
        """Run the command in the container's namespaces and root (nsenter), with its env."""
        pid = container.proc.pid if container.proc else 0
        argv = list(command)
        if shutil.which("nsenter") and pid:
            argv = ["nsenter", "-t", str(pid), "-m", "-u", "-r", "-w", "--", *argv]
        result = subprocess.run(
            argv,
            env=container.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        return result.returncode == 0

    # --- stopping -----------------------------------------------------------------------

    def _terminate(self, run: PodRun, grace: int, finalize: bool = True) -> None:
        """SIGTERM every container group, SIGKILL after the grace period, then finalize."""
        with run.lock:  # no container starts after this
            run.terminating = True
        log.info("killing pod %s/%s (grace %ss)", run.namespace, run.name, grace)
        containers = run.init_containers + run.containers
        for container in containers:
            container.restart_at = None
            if not container.poll():
                container.kill_group(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and not all(
            c.poll() or c.proc is None for c in containers
        ):
            time.sleep(0.1)
        for container in containers:
            if not container.poll():
                container.kill_group(signal.SIGKILL)
                container.cgroups.kill_all()
        kill_deadline = time.monotonic() + 30
        while not all(c.poll() or c.proc is None for c in containers):
            if time.monotonic() > kill_deadline:  # unkillable (D state): give up waiting
                log.error("pod %s/%s: processes survive SIGKILL", run.namespace, run.name)
                break
            time.sleep(0.05)
        if run.stage != "running" and not run.failed:
            run.failed = True  # killed before it ran: Failed, like the real kubelet
            for container in run.containers + run.init_containers:
                if container.proc is None and container.exit_code is None:
                    container.waiting_reason = "ContainerCreating"
        if finalize:
            self._report(run)
            self._finalize({"namespace": run.namespace, "name": run.name, "uid": run.uid})
        self._release(run)
        with self.runs_lock:
            self.runs.pop(run.uid, None)

    def _release(self, run: PodRun) -> None:
        """Free what the pod held on the host: its IP and its cgroups."""
        with run.lock:
            if run.released:
                return
            run.released = True
        for container in run.init_containers + run.containers:
            container.cgroups.remove()
        if run.ip and run.ip != HOST_IP:
            self.ips.release(run.ip)

    def _finalize(self, meta: dict[str, Any]) -> None:
        # The apiserver only marks a graceful delete; the kubelet removes the object.
        try:
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=meta["uid"])
                ),
            )
            log.info("pod %s/%s removed", meta["namespace"], meta["name"])
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    def _on_deleted(self, pod: dict[str, Any]) -> None:
        with self.runs_lock:
            run = self.runs.get(pod["metadata"]["uid"])
        if run is not None and not run.terminating:
            self._terminate(run, grace=0, finalize=False)

    # --- lifecycle ----------------------------------------------------------------------

    def run(self) -> None:
        """Register, then serve until stop() is called."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.register()
        self._renew_lease()
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._reap_loop, name="reaper", daemon=True),
            threading.Thread(target=self._watch_loop, name="pod-watch", daemon=True),
            threading.Thread(target=self._probe_loop, name="prober", daemon=True),
        ]
        for thread in threads:
            thread.start()
        self.stopping.wait()
        with self.runs_lock:
            runs = list(self.runs.values())
        for run in runs:  # the machine is going away: no status updates, just kill
            self._terminate(run, grace=0, finalize=False)
        self.cgroups.close()

    def stop(self) -> None:
        self.stopping.set()


def _port(container: dict[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"no container port named {port!r}")


def _probe_http(get: dict[str, Any], container: dict[str, Any], ip: str, timeout: float) -> bool:
    host, port = get.get("host") or ip, _port(container, get["port"])
    if (get.get("scheme") or "HTTP").upper() == "HTTPS":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl._create_unverified_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
        conn.request("GET", get.get("path") or "/", headers=headers)
        return 200 <= conn.getresponse().status < 400
    finally:
        conn.close()


def run_as(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """runAsUser/runAsGroup/supplementalGroups (container over pod) for podinit.py."""
    pod_ctx = pod_spec.get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    out: dict[str, Any] = {}
    user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    group = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
    if user is not None:
        out["uid"] = int(user)
        out["gid"] = int(group if group is not None else 0)
        groups = list(pod_ctx.get("supplementalGroups") or [])
        if pod_ctx.get("fsGroup") is not None:
            groups.append(pod_ctx["fsGroup"])
        out["groups"] = [int(g) for g in groups]
    return out


def _host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in HOST_ENV}


def _host_paths(env: dict[str, str]) -> list[str]:
    """The host paths a container must see whatever its /tmp: the interpreter's prefix, the
    repository, and what the host env points to (PATH, PYTHONPATH, VIRTUAL_ENV)."""
    paths = [sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2])]
    for variable in ("PATH", "PYTHONPATH"):
        paths += filter(None, env.get(variable, "").split(os.pathsep))
    paths += filter(None, [env.get("VIRTUAL_ENV")])
    return sorted({os.path.realpath(p) for p in paths} | set(paths))


def parse_capacity(text: str) -> dict[str, str]:
    """Parse "cpu=4,pods=20" over the default capacity."""
    capacity = dict(DEFAULT_CAPACITY)
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        capacity[key.strip()] = value.strip()
    return capacity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node-name", default="process-node-1")
    parser.add_argument("--capacity", default="", help="e.g. cpu=4,pods=20")
    parser.add_argument("--workdir", default="", help="pod logs and working directories")
    parser.add_argument("--pod-cidr", default="127.1.0.0/16", help="pod IPs (inside 127.0.0.0/8)")
    parser.add_argument("--cluster-dns", default="", help="nameserver for ClusterFirst pods")
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument("--pvc-root", default="", help="claims whose PV has no host path")
    parser.add_argument(
        "--host-path", action="append", default=[], help="seen by every container, even in /tmp"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kubelet %(message)s")
    workdir = Path(args.workdir or f"/tmp/process-kubelet-{args.node_name}")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    kubelet = ProcessKubelet(
        api,
        args.node_name,
        parse_capacity(args.capacity),
        workdir,
        pod_cidr=args.pod_cidr,
        cluster_dns=args.cluster_dns,
        cluster_domain=args.cluster_domain,
        pvc_root=Path(args.pvc_root) if args.pvc_root else None,
        host_paths=args.host_path,
    )
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop())
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
