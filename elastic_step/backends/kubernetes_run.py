"""What the run that owns a job asks of its master, read from the Kubernetes API.

A pipeline engine stops a run by changing objects; the SIGTERM that follows reaches the
master only where the engine can exec into its pod and the launcher passes the signal on.
So the master reads the objects themselves:

- the run's object (the job's owner, see kubernetes_job_objects.py): an Argo ``Workflow`` with
  ``spec.shutdown`` set (``argo stop``, ``argo terminate``), ``spec.activeDeadlineSeconds``
  0 (Kubeflow Pipelines' Terminate) or a phase that has ended; a ``batch/v1`` Job that is
  suspended or has failed; any owner being deleted, or gone. Each is a STOP.
- the master's own pod, deleted: a HANDOVER when the platform moves it (a DisruptionTarget:
  evicted, preempted) or when an engine owns it and starts the step again (a Workflow's
  ``retryStrategy``, a Job's ``backoffLimit``); a STOP for a bare master pod, where nothing
  would start it again.

:class:`RunWatch` polls both objects every :data:`POLL_S` seconds in a thread of its own,
so a stop is seen within seconds with no signal at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from elastic_step.backends.api import StopKind, StopRequest
from elastic_step.backends.kubernetes_client import Kube, KubeCallError
from elastic_step.backends.kubernetes_watch import disruption_of, one_line

log = logging.getLogger(__name__)

#: Seconds between two reads of the master pod and the run's object.
POLL_S = 2.0
#: (connect, read) timeouts of one read.
READ_TIMEOUT = (2.0, 3.0)
#: Workflow phases after which its steps' results are not used.
WORKFLOW_ENDED = ("Succeeded", "Failed", "Error")
#: A read that could not be made: nothing is concluded from it.
UNREAD: dict[str, Any] = {}

#: A read of one object: the object, None when it is gone (404).
Reader = Callable[[], dict[str, Any] | None]


def engine_restarts(owner: dict[str, Any] | None) -> bool:
    """True when the owner (an ownerReference) is a run that starts a lost step's pod again:
    an Argo Workflow or a batch Job. The backend takes only these for the run's object."""
    if owner is None:
        return False
    workflow = owner["kind"] == "Workflow" and owner["apiVersion"].startswith("argoproj.io/")
    return workflow or (owner["kind"] == "Job" and owner["apiVersion"] == "batch/v1")


def _run_stop(owner: dict[str, Any], run: dict[str, Any] | None) -> str | None:
    """Why the run's object says the run is stopped, or None."""
    what = f"{owner['kind']} {owner['name']}"
    if run is None:
        return f"{what} was deleted"
    if run is UNREAD:
        return None
    if (run.get("metadata") or {}).get("uid") not in (None, owner.get("uid")):
        return f"{what} was deleted (another object now has its name)"
    if (run.get("metadata") or {}).get("deletionTimestamp"):
        return f"{what} is being deleted"
    spec, status = run.get("spec") or {}, run.get("status") or {}
    if owner["kind"] == "Workflow":
        if spec.get("shutdown"):
            return f"{what}: spec.shutdown is {spec['shutdown']}"
        if spec.get("activeDeadlineSeconds") == 0:
            return f"{what}: spec.activeDeadlineSeconds is 0 (a Terminate)"
        if status.get("phase") in WORKFLOW_ENDED:
            return f"{what} has ended ({status['phase']})"
    if owner["kind"] == "Job":
        if spec.get("suspend"):
            return f"{what} is suspended"
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                return f"{what} has failed ({condition.get('reason') or 'Failed'})"
    return None


def stop_request_of(
    owner: dict[str, Any] | None,
    run: dict[str, Any] | None,
    master_pod_name: str | None,
    master_pod: dict[str, Any] | None,
) -> StopRequest | None:
    """What the run's object and the master's pod ask of the master (see the module).

    ``run`` and ``master_pod`` are the objects as read, None when gone, :data:`UNREAD`
    when they could not be read (or there is none to read).
    """
    if owner is not None:
        reason = _run_stop(owner, run)
        if reason is not None:
            return StopRequest(StopKind.STOP, reason)
    if master_pod_name is None or master_pod is UNREAD:
        return None
    if master_pod is not None and not master_pod["metadata"].get("deletionTimestamp"):
        return None
    what = f"the master's pod {master_pod_name}"
    disruption = None if master_pod is None else disruption_of(master_pod)
    if disruption is not None:
        reason = one_line(f"{disruption[0]}: {disruption[1]}").rstrip(": ")
        return StopRequest(StopKind.HANDOVER, reason)
    state = "was deleted" if master_pod is None else "is being deleted"
    if engine_restarts(owner):
        return StopRequest(
            StopKind.HANDOVER, f"{what} {state}; {owner['kind']} {owner['name']} starts it again"
        )
    return StopRequest(StopKind.STOP, f"{what} {state}")


class RunWatch:
    """Polls the master's pod and the run's object; :meth:`request` answers from the last
    poll, :meth:`read_now` polls at once."""

    def __init__(self, kube: Kube, master_pod_name: str | None, api_client: Any) -> None:
        self._kube = kube
        self._master_pod_name = master_pod_name
        self._api_client = api_client
        self._owner: dict[str, Any] | None = None
        self._readers: dict[str, Reader] = {}
        self._refused: set[str] = set()
        self._request: StopRequest | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, owner: dict[str, Any] | None) -> None:
        """Starts polling; ``owner`` is the run's object (None: a master outside the run)."""
        if self._thread is not None:
            return
        self._owner = owner
        if self._master_pod_name is not None:
            self._readers["master pod"] = self._pod_reader()
        if owner is not None:
            self._readers[f"{owner['kind']} {owner['name']}"] = self._owner_reader(owner)
        self._thread = threading.Thread(target=self._run, name="kubernetes-run-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def request(self) -> StopRequest | None:
        with self._lock:
            return self._request

    def read_now(self) -> StopRequest | None:
        request = self._poll()
        with self._lock:
            self._request = request or self._request
            return self._request

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                request = self._poll()
            except Exception:  # the watch must outlive any one answer
                log.exception("kubernetes: reading the run's state failed")
                continue
            if request is None:
                continue
            with self._lock:
                if self._request is None:
                    log.info("kubernetes: %s (%s)", request.reason, request.kind)
                self._request = self._request or request

    def _poll(self) -> StopRequest | None:
        read = {what: self._read(what, reader) for what, reader in self._readers.items()}
        owner = self._owner
        run = UNREAD if owner is None else read[f"{owner['kind']} {owner['name']}"]
        return stop_request_of(owner, run, self._master_pod_name, read.get("master pod", UNREAD))

    def _read(self, what: str, reader: Reader) -> dict[str, Any] | None:
        if what in self._refused:
            return UNREAD
        try:
            return reader()
        except KubeCallError as e:
            if e.not_found:
                return None
            if e.forbidden:
                self._refused.add(what)
                log.warning(
                    "kubernetes: cannot read %s (%s): the master learns of a stop of the "
                    "run only from SIGTERM; grant the verbs of manifests/rbac.yaml",
                    what,
                    e,
                )
            else:
                log.debug("kubernetes: reading %s: %s", what, e)
            return UNREAD

    def _pod_reader(self) -> Reader:
        core, name, ns = self._kube.core, self._master_pod_name, self._kube.namespace
        return lambda: self._kube.call(
            "get", "pods", core.read_namespaced_pod, name, ns, timeout=READ_TIMEOUT
        )

    def _owner_reader(self, owner: dict[str, Any]) -> Reader:
        kind, name, ns = owner["kind"], owner["name"], self._kube.namespace
        if kind == "Workflow":
            group, version = owner["apiVersion"].split("/", 1)
            api = client.CustomObjectsApi(self._api_client)
            return lambda: self._kube.call(
                "get",
                "workflows",
                api.get_namespaced_custom_object,
                group,
                version,
                ns,
                "workflows",
                name,
                timeout=READ_TIMEOUT,
            )
        if kind == "Job":
            batch = client.BatchV1Api(self._api_client)
            return lambda: self._kube.call(
                "get", "jobs", batch.read_namespaced_job, name, ns, timeout=READ_TIMEOUT
            )
        core = self._kube.core
        return lambda: self._kube.call(
            "get", "configmaps", core.read_namespaced_config_map, name, ns, timeout=READ_TIMEOUT
        )
