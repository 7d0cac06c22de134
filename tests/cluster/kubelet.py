"""A kubelet that runs pods as local processes, for tests against a real control plane.

It registers a Node with a fixed capacity, keeps it Ready (status heartbeat and Lease),
watches the pods the scheduler binds to it, runs each container's command as a process in
its own session, and reports status through the API the way the real kubelet does:
Pending -> Running -> Succeeded/Failed. A deleted pod (by a user, the garbage collector, an
eviction or a preemption) gets SIGTERM, SIGKILL after its grace period, and then the final
delete with grace 0, which only a kubelet issues.

Run: python tests/cluster/kubelet.py --kubeconfig admin.kubeconfig --node-name node-1
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

# Run as a script: its sibling module is importable from here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from podenv import POD_IP, container_argv, container_env

log = logging.getLogger("process-kubelet")

DEFAULT_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "20", "ephemeral-storage": "10Gi"}
# Variables a process needs to run at all on this machine; real pods get only their own env.
HOST_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
HEARTBEAT_SECONDS = 5
LEASE_SECONDS = 40


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Container:
    """One container of a pod, running as a local process group."""

    name: str
    image: str
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    message: str = ""

    def poll(self) -> bool:
        """True once the container has terminated; records how it ended."""
        if self.exit_code is not None:
            return True
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        self.kill_group(signal.SIGKILL)  # the container ends with its main process
        self.finished_at = now()
        if code < 0:
            self.signal, self.exit_code = -code, 128 - code
            self.reason = "Error"
        else:
            self.exit_code = code
            self.reason = "Completed" if code == 0 else "Error"
        return True

    def fail_to_start(self, message: str) -> None:
        self.started_at = self.finished_at = now()
        self.exit_code, self.reason, self.message = 128, "StartError", message

    def kill_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def status(self) -> dict[str, Any]:
        container_id = f"process://{self.proc.pid}" if self.proc else ""
        state: dict[str, Any]
        if self.exit_code is None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason,
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                    "containerID": container_id,
                }
            }
            if self.signal:
                state["terminated"]["signal"] = self.signal
            if self.message:
                state["terminated"]["message"] = self.message
        return {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": container_id,
            "ready": self.exit_code is None,
            "started": self.exit_code is None,
            "restartCount": 0,
            "state": state,
        }


@dataclass
class PodRun:
    """The kubelet's record of one pod it has started."""

    uid: str
    namespace: str
    name: str
    containers: list[Container]
    started_at: str
    terminating: bool = False
    reported_terminal: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self) -> bool:
        return all(c.poll() for c in self.containers)

    def phase(self) -> str:
        if not self.done():
            return "Running"
        return "Succeeded" if all(c.exit_code == 0 for c in self.containers) else "Failed"


class ProcessKubelet:
    """Registers one Node and runs the pods bound to it as local processes."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        capacity: dict[str, str],
        workdir: Path,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.node_name = node_name
        self.capacity = capacity
        self.workdir = workdir
        self.base_env = base_env if base_env is not None else _host_env()
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
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name}}
        body["metadata"]["labels"] = labels
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
                {"type": "InternalIP", "address": POD_IP},
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
            except Exception:
                log.exception("heartbeat failed")

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
        self._start(pod)

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        pod_dir = self.workdir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        containers = []
        for spec_container in spec["containers"]:
            container = Container(name=spec_container["name"], image=spec_container["image"])
            containers.append(container)
            try:
                env = container_env(pod, spec_container, self.base_env, self._lookup)
                argv = container_argv(spec_container, env)
                container.started_at = now()
                with (pod_dir / f"{container.name}.log").open("ab") as logfile:
                    container.proc = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=spec_container.get("workingDir") or pod_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=logfile,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # own process group: kill reaches children
                    )
            except (OSError, ValueError, ApiException) as err:
                container.fail_to_start(str(err))
        run = PodRun(meta["uid"], meta["namespace"], meta["name"], containers, now())
        with self.runs_lock:
            self.runs[run.uid] = run
        pids = [c.proc.pid for c in containers if c.proc]
        log.info("started pod %s/%s pids %s", run.namespace, run.name, pids)
        self._report(run)

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

    def _reap_loop(self) -> None:
        # Processes that end by themselves make their pod Succeeded or Failed.
        while not self.stopping.wait(0.2):
            with self.runs_lock:
                runs = list(self.runs.values())
            for run in runs:
                if not run.terminating and not run.reported_terminal and run.done():
                    self._report(run)

    def _report(self, run: PodRun) -> None:
        with run.lock:
            if run.reported_terminal:
                return
            phase = run.phase()
            ready = "True" if phase == "Running" else "False"
            stamp = now()
            conditions = [
                {"type": "PodReadyToStartContainers", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ]
            for condition in conditions:
                condition["lastTransitionTime"] = stamp
            status = {
                "phase": phase,
                "hostIP": POD_IP,
                "hostIPs": [{"ip": POD_IP}],
                "podIP": POD_IP,
                "podIPs": [{"ip": POD_IP}],
                "startTime": run.started_at,
                "conditions": conditions,
                "containerStatuses": [c.status() for c in run.containers],
            }
            meta = {"namespace": run.namespace, "name": run.name, "uid": run.uid}
            if self._patch_status(meta, status) and phase != "Running":
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

    def _terminate(self, run: PodRun, grace: int, finalize: bool = True) -> None:
        """SIGTERM every container group, SIGKILL after the grace period, then finalize."""
        run.terminating = True
        log.info("killing pod %s/%s (grace %ss)", run.namespace, run.name, grace)
        for container in run.containers:
            if not container.poll():
                container.kill_group(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        deadline = time.monotonic() + grace
        while not run.done() and time.monotonic() < deadline:
            time.sleep(0.1)
        for container in run.containers:
            if not container.poll():
                container.kill_group(signal.SIGKILL)
        while not run.done():  # poll() also kills what is left of each process group
            time.sleep(0.05)
        if finalize:
            self._report(run)
            self._finalize({"namespace": run.namespace, "name": run.name, "uid": run.uid})
        with self.runs_lock:
            self.runs.pop(run.uid, None)

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
        ]
        for thread in threads:
            thread.start()
        self.stopping.wait()
        with self.runs_lock:
            runs = list(self.runs.values())
        for run in runs:  # the machine is going away: no status updates, just kill
            self._terminate(run, grace=0, finalize=False)

    def stop(self) -> None:
        self.stopping.set()


def _host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in HOST_ENV}


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s kubelet %(message)s")
    workdir = Path(args.workdir or f"/tmp/process-kubelet-{args.node_name}")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    kubelet = ProcessKubelet(api, args.node_name, parse_capacity(args.capacity), workdir)
    signal.signal(signal.SIGTERM, lambda *_: kubelet.stop())
    signal.signal(signal.SIGINT, lambda *_: kubelet.stop())
    kubelet.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
