"""The ``kubernetes`` backend: the master, usually itself a pod in a pipeline step, runs its
workers and parameter servers as pods, with no operator.

**Objects.** Each instance is one pod, ``<job>-<instance>`` (names are never reused), with
``restartPolicy: Never``: the master replaces pods, the kubelet does not restart them. The
job also has a Secret ``<job>-secret`` (the values of each ``LaunchSpec.secret_env`` under
``<instance>.<VARIABLE>``, which the pod reads with ``secretKeyRef``: no secret value is
ever in a pod spec or a log; an ended instance's keys are removed) and a headless
Service ``<job>-master`` that selects the pod labelled ``elastic-step/master: <job>``. The
master labels its own pod so (and takes the label off any older master pod), so instances
reach ``<job>-master.<namespace>.svc:<port>`` whichever pod the master runs in now. The
manifests are built in ``kubernetes_pods.py``; ``--dry-run`` prints the same ones.

**Ownership.** Pods, the Service and the Secret are never owned by the master's pod: the
garbage collector would delete them when that pod is replaced, which is exactly when a new
master must adopt them. They are owned by the run's object, found from the master pod's own
``ownerReferences`` (its controller reference):

- an Argo ``Workflow`` (``argoproj.io``; KFP runs on Argo): deleting the run removes all;
- a ``batch/v1`` ``Job`` (the master run as a Kubernetes Job, with no pipeline engine);
- otherwise (no owner, another kind, or a master outside the cluster) a ConfigMap
  ``<job>-owner`` that the backend creates: deleting it garbage-collects everything.

Owner references are not controller references and do not block the owner's deletion. The
job's state on the cluster (its Lease and state ConfigMaps) has the same owner, so a
stopped job resumes, and only deleting the run (or the owner ConfigMap) forgets it:
:meth:`remove_job_objects` removes the Service and the Secret, never the owner.

**Stop.** How the master learns that the run is stopped, or that it is moved itself, from
the API rather than from a signal: see ``kubernetes_run.py``.

**Launch.** :meth:`launch` only queues the create: a small pool of threads makes the API
calls, so the master's lock never waits on API latency. A create that timed out but was
made is found by its name (409 AlreadyExists with this job's labels is success). A create
refused for lack of quota (403 "exceeded quota") keeps the instance PENDING, with the
refusal as its message, and is retried after 5, 10, 20, then every 30 s until it is made or
deleted: like an unschedulable pod, it uses no restart and blocks nothing. Transient
failures (no answer, 5xx, 429) are retried with a capped backoff for
``create_retry_s`` (5 minutes), then the instance ends as LOST and the master replaces it. A
create refused for good (Forbidden by RBAC or Pod Security admission, Invalid, a name taken
by another pod) ends the instance as CRASHED with the API's one-line message: the job's own
configuration is at fault, so ``--max-restarts`` bounds the attempts and the job fails with
that message rather than retrying forever. A delete that comes before the pod exists ends
the instance at once (DELETED), and nothing is made.

**Watch.** One thread lists the job's pods and watches them from the list's
resourceVersion; on 410 Gone it lists again, and a pod that vanished in between is reported
from its last known state (or its Events, or as LOST). STARTED is sent once the pod is
Running; PENDING while it waits for a reason worth telling (the scheduler's
"Unschedulable: 0/3 nodes are available: ..." or an image pull error); EXITED as read by
``kubernetes_watch.pod_state``. A pod that stays Terminating ``terminating_timeout_s`` past
its grace period (a lost node) ends as LOST; its replacement has a new name, and the PS
fence their writes, so a zombie cannot be confused with it.

**The master's pod.** Found by ``ELASTIC_STEP_POD_NAME`` (set it from the downward API
``metadata.name``), else ``KFP_POD_NAME``, else the hostname when in a pod. The master
listens on ``ELASTIC_STEP_POD_IP`` (downward API ``status.podIP``) or on its pod's
``status.podIP``. Outside a pod (development) there is no Service: it listens on and
advertises this machine's address toward the API server.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import (
    Backend,
    BackendError,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchSpec,
    Role,
    StopRequest,
    take_events,
)
from elastic_step.backends.kubernetes_client import (
    Kube,
    KubeCallError,
    address_toward,
    backoff_s,
    load_api_client,
)
from elastic_step.backends.kubernetes_options import KubernetesOptions
from elastic_step.backends.kubernetes_run import RunWatch, engine_restarts
from elastic_step.backends.kubernetes_watch import (
    Phase,
    PodWatch,
    disruption_of,
    one_line,
    pod_state,
)
from elastic_step.errors import InputError

log = logging.getLogger(__name__)

#: Retry delays of a create refused for quota: 5, 10, 20, then every 30 s.
QUOTA_RETRY_S = (5.0, 10.0, 20.0, 30.0)
#: How long a delete is retried while the API does not answer.
DELETE_RETRY_S = 120.0
#: Seconds for the calls of :meth:`remove_job_objects`, all of them (the master's whole stop,
#: its waiting for instances included, must fit in 20 s).
REMOVE_DEADLINE_S = 10.0
_DETECT_FROM_ENV = object()


def master_pod_from_env(in_cluster: bool) -> str | None:
    """The master's own pod name: ``ELASTIC_STEP_POD_NAME``, ``KFP_POD_NAME``, or the hostname
    in a pod (a pod's hostname is its name unless its spec sets another)."""
    for variable in ("ELASTIC_STEP_POD_NAME", "KFP_POD_NAME"):
        if os.environ.get(variable):
            return os.environ[variable]
    return socket.gethostname() if in_cluster else None


@dataclass(eq=False)
class _Instance:
    name: str
    role: Role
    index: int
    pod_name: str
    spec: LaunchSpec | None = None
    #: The uid of its pod, once it is known to exist.
    uid: str | None = None
    #: Monotonic time by which the pod was known to exist: a list asked for later must show it.
    exists_since: float = math.inf
    #: The create is queued or being retried.
    creating: bool = False
    create_attempts: int = 0
    quota_refusals: int = 0
    first_attempt: float = 0.0
    started: bool = False
    ended: bool = False
    pending_message: str = ""
    #: The master asked for it to stop (sticky), and a delete is under way.
    delete_requested: bool = False
    deleting: bool = False
    delete_grace_s: float = 5.0
    delete_since: float = 0.0
    disruption: tuple[str, str] | None = None
    terminating_deadline: float | None = None
    last_pod: dict[str, Any] | None = None
    #: Serializes the API calls for this instance (its create before its delete).
    op_lock: threading.Lock = field(default_factory=threading.Lock)


class _Pool:
    """A few threads running queued calls, each at its due time (retries are re-queued with a
    delay, never slept in a thread)."""

    def __init__(self, threads: int) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"kubernetes-api-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[[], None], delay_s: float = 0.0) -> None:
        with self._cv:
            if self._closed:
                return
            heapq.heappush(self._heap, (time.monotonic() + delay_s, next(self._seq), fn))
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        fn = heapq.heappop(self._heap)[2]
                        break
                    self._cv.wait(self._heap[0][0] - now if self._heap else None)
                else:
                    return
            try:
                fn()
            except Exception:
                log.exception("kubernetes backend: an API operation failed")


class KubernetesBackend(Backend):
    def __init__(
        self,
        job_name: str,
        options: KubernetesOptions | None = None,
        *,
        api_client: client.ApiClient | None = None,
        master_pod: Any = _DETECT_FROM_ENV,
        terminating_timeout_s: float = 60.0,
        create_retry_s: float = 300.0,
        api_threads: int = 4,
    ) -> None:
        """``api_client``: instead of loading a configuration (see ``load_api_client``);
        ``master_pod``: the master's own pod name, or None for a master outside the cluster
        (default: from the environment, see :func:`master_pod_from_env`)."""
        self._job = job_name
        self._options = options or KubernetesOptions()
        if api_client is None:
            api_client, namespace, in_cluster = load_api_client(self._options.kubeconfig)
        else:
            namespace, in_cluster = None, False
        self._api_client = api_client
        self._namespace = self._options.namespace or namespace or "default"
        self._kube = Kube(client.CoreV1Api(api_client), self._namespace)
        self._master_pod: str | None = (
            master_pod_from_env(in_cluster) if master_pod is _DETECT_FROM_ENV else master_pod
        )
        if self._master_pod is None and self._options.image is None:
            raise InputError(
                "--image is required when the master does not run in a pod (in a pod, the "
                "default is the master pod's own image)"
            )
        self._terminating_timeout_s = terminating_timeout_s
        self._create_retry_s = create_retry_s
        self._lock = threading.RLock()
        self._instances: dict[str, _Instance] = {}
        #: The watch's latest view of every pod of the job, and the last state of deleted ones.
        self._seen: dict[str, dict[str, Any]] = {}
        self._gone: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._events: queue.Queue[InstanceEvent] = queue.Queue()
        self._setup_lock = threading.Lock()
        self._owner: dict[str, Any] | None = None
        self._image = self._options.image
        #: What the job's Secret holds, as this master put it there.
        self._secret_values: dict[str, str] = {}
        self._secret_made = False
        self._listen_host: str | None = None
        self._closed = False
        self._pool = _Pool(api_threads)
        self._watch = PodWatch(
            self._kube, pods.job_selector(job_name), self._on_list, self._on_watch_event
        )
        self._watch.start()
        self._run_watch = RunWatch(self._kube, self._master_pod, api_client)

    @property
    def namespace(self) -> str:
        return self._namespace

    # -- the Backend interface --

    def launch(self, spec: LaunchSpec) -> None:
        # Checked here, so that a spec no pod can carry fails the launch, not a thread.
        pods.build_pod(
            spec, self._options, job_name=self._job, namespace=None, image="x", owner=None
        )
        with self._lock:
            instance = self._instances.get(spec.name)
            if instance is not None:
                if not instance.ended:
                    return  # live: a launch is idempotent
                raise BackendError(f"instance name {spec.name} was used before in this job")
            instance = _Instance(
                spec.name,
                spec.role,
                spec.index,
                pods.pod_name(self._job, spec.name),
                spec=spec,
                creating=True,
                first_attempt=time.monotonic(),
            )
            self._instances[spec.name] = instance
        self._pool.submit(lambda: self._guarded(instance, self._create))

    def delete(self, name: str, grace_period_s: float = 5.0) -> None:
        with self._lock:
            instance = self._instances.get(name)
            if instance is None or instance.ended or instance.deleting:
                return
            instance.delete_requested = instance.deleting = True
            instance.delete_grace_s = grace_period_s
            instance.delete_since = time.monotonic()
        self._pool.submit(lambda: self._guarded(instance, self._delete))

    def list_instances(self) -> list[InstanceInfo]:
        data = self._kube.call(
            "list",
            "pods",
            self._kube.core.list_namespaced_pod,
            self._namespace,
            label_selector=pods.job_selector(self._job),
            retry_for_s=30,
        )
        answered = time.monotonic()
        live = []
        with self._lock:
            for pod in data.get("items") or []:
                instance = self._adopt(pod, answered)
                if instance is not None:
                    # What the watch saw of it, before it was ours to report, counts too.
                    for seen in (self._seen.get(instance.pod_name), pod):
                        if seen is not None and seen["metadata"]["uid"] == instance.uid:
                            self._observe(instance, seen)
                    tombstone = self._gone.get(instance.pod_name)
                    if tombstone is not None and tombstone["metadata"]["uid"] == instance.uid:
                        self._observe(instance, tombstone, gone=True)
            for instance in self._instances.values():
                if not instance.ended:
                    live.append(InstanceInfo(instance.name, instance.role, instance.index))
        return sorted(live, key=lambda i: i.name)

    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        self._end_stuck_terminating()
        return take_events(self._events, timeout_s)

    def listen_host(self) -> str:
        if self._listen_host is None:
            self._listen_host = self._find_listen_host()
        return self._listen_host

    def advertise_master(self, port: int) -> str:
        if self._master_pod is None:
            return f"{self.listen_host()}:{port}"
        self._ensure_setup()
        self._label_master_pod()
        self._ensure_service(port)
        return f"{pods.service_name(self._job)}.{self._namespace}.svc:{port}"

    def stop_request(self, signalled: bool = False) -> StopRequest | None:
        if not signalled:
            return self._run_watch.request()
        self._ensure_setup()  # the run's object is found there
        return self._run_watch.read_now()

    def remove_job_objects(self) -> None:
        deadline = time.monotonic() + REMOVE_DEADLINE_S
        timeout = (2.0, 3.0)

        def attempt(verb: str, resource: str, method, *args, **kwargs) -> dict[str, Any]:
            if time.monotonic() > deadline:
                log.warning("out of time to %s %s of job %s", verb, resource, self._job)
                return {}
            try:
                return self._kube.call(verb, resource, method, *args, timeout=timeout, **kwargs)
            except KubeCallError as e:
                if not e.not_found:
                    log.warning("%s", e)
                return {}

        core, ns = self._kube.core, self._namespace
        listed = attempt(
            "list",
            "pods",
            core.list_namespaced_pod,
            ns,
            label_selector=pods.job_selector(self._job),
        )
        for pod in listed.get("items") or []:
            metadata = pod["metadata"]
            if metadata.get("deletionTimestamp"):
                continue
            ended = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            with self._lock:
                for instance in self._instances.values():
                    if instance.uid == metadata["uid"]:
                        instance.delete_requested = True
            attempt(
                "delete",
                "pods",
                core.delete_namespaced_pod,
                metadata["name"],
                ns,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0 if ended else 1,
                    preconditions=client.V1Preconditions(uid=metadata["uid"]),
                ),
            )
        service, secret = pods.service_name(self._job), pods.secret_name(self._job)
        attempt("delete", "services", core.delete_namespaced_service, service, ns)
        attempt("delete", "secrets", core.delete_namespaced_secret, secret, ns)
        if self._owner is not None:
            log.info(
                "kubernetes: the state of job %s stays until %s %s is deleted",
                self._job,
                self._owner["kind"],
                self._owner["name"],
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watch.stop()
        self._run_watch.stop()
        self._pool.close()

    def owner_reference(self) -> dict | None:
        self._ensure_setup()
        return dict(self._owner)

    def _read_master_pod(self) -> dict[str, Any]:
        return self._kube.call(
            "get",
            "pods",
            self._kube.core.read_namespaced_pod,
            self._master_pod,
            self._namespace,
            retry_for_s=30,
        )

    # -- set-up: owner, image, Secret, Service --

    def _ensure_setup(self) -> None:
        """Finds the owner of the job's objects and the image, once."""
        with self._setup_lock:
            if self._owner is not None:
                return
            owner = None
            if self._master_pod is not None:
                pod = self._read_master_pod()
                owner = self._run_owner(pod)
                if self._image is None:
                    containers = pod["spec"]["containers"]
                    main = next((c for c in containers if c["name"] == pods.CONTAINER), None)
                    self._image = (main or containers[0])["image"]
            if owner is None:
                owner = self._make_owner()
            if self._image is None:
                raise BackendError(
                    "--image is required when the master does not run in a pod "
                    "(in a pod, the default is the master pod's own image)"
                )
            self._owner = owner
            self._run_watch.start(owner)
            log.info(
                "kubernetes: job %s in namespace %s, objects owned by %s %s",
                self._job,
                self._namespace,
                owner["kind"],
                owner["name"],
            )

    @staticmethod
    def _run_owner(master_pod: dict[str, Any]) -> dict[str, Any] | None:
        """The run's object from the master pod's controller reference: an Argo Workflow or a
        batch Job; None for anything else (the master pod's own ReplicaSet, say)."""
        for ref in master_pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and engine_restarts(ref):
                return pods.owner_reference(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
        return None

    def _make_owner(self) -> dict[str, Any]:
        name = pods.owner_name(self._job)
        core = self._kube.core
        try:
            made = self._kube.call(
                "create",
                "configmaps",
                core.create_namespaced_config_map,
                self._namespace,
                pods.build_owner(self._job, self._namespace),
                retry_for_s=30,
            )
        except KubeCallError as e:
            if not e.conflict:
                raise
            made = self._kube.call(
                "get", "configmaps", core.read_namespaced_config_map, name, self._namespace
            )
        return pods.owner_reference("v1", "ConfigMap", name, made["metadata"]["uid"])

    def _ensure_secret(self, spec: LaunchSpec) -> None:
        """Puts the instance's secret values into the job's Secret, before its pod exists."""
        values = {pods.secret_key(spec.name, k): v for k, v in spec.secret_env.items()}
        with self._setup_lock:
            if all(self._secret_values.get(k) == v for k, v in values.items()):
                return
            body = pods.build_secret(self._job, self._namespace, values, self._owner)
            core = self._kube.core
            made = False
            if not self._secret_made:
                try:
                    self._kube.call(
                        "create", "secrets", core.create_namespaced_secret, self._namespace, body
                    )
                    made = True
                except KubeCallError as e:
                    if not e.conflict:
                        raise
            if not made:
                # The Secret exists (this master's, or an earlier one's): add the keys. A
                # patch needs no read, and the master may not read Secrets.
                self._kube.call(
                    "patch",
                    "secrets",
                    core.patch_namespaced_secret,
                    pods.secret_name(self._job),
                    self._namespace,
                    {"data": body["data"]},
                )
            self._secret_made = True
            self._secret_values.update(values)

    def _forget_secret(self, instance: _Instance) -> None:
        """Takes an ended instance's keys out of the job's Secret (its pod read them when it
        started), so that the Secret does not grow with every replacement."""
        if instance.spec is None or not instance.spec.secret_env:
            return  # adopted: its keys go with the Secret at the end of the job
        keys = [pods.secret_key(instance.name, k) for k in instance.spec.secret_env]
        with self._setup_lock:
            if not any(k in self._secret_values for k in keys):
                return
            for key in keys:
                self._secret_values.pop(key, None)
        try:
            self._kube.call(
                "patch",
                "secrets",
                self._kube.core.patch_namespaced_secret,
                pods.secret_name(self._job),
                self._namespace,
                {"data": dict.fromkeys(keys)},
            )
        except KubeCallError as e:
            if not e.not_found:
                log.warning("%s", e)

    def _label_master_pod(self) -> None:
        core = self._kube.core
        label = pods.LABEL_MASTER
        labelled = self._kube.call(
            "list",
            "pods",
            core.list_namespaced_pod,
            self._namespace,
            label_selector=f"{label}={self._job}",
            retry_for_s=30,
        )
        for pod in labelled.get("items") or []:
            name = pod["metadata"]["name"]
            if name != self._master_pod:
                # An earlier master's pod: the Service must select only this one.
                try:
                    self._kube.call(
                        "patch",
                        "pods",
                        core.patch_namespaced_pod,
                        name,
                        self._namespace,
                        {"metadata": {"labels": {label: None}}},
                    )
                except KubeCallError as e:
                    if not e.not_found:
                        raise
        self._kube.call(
            "patch",
            "pods",
            core.patch_namespaced_pod,
            self._master_pod,
            self._namespace,
            {"metadata": {"labels": {label: self._job}}},
            retry_for_s=30,
        )

    def _ensure_service(self, port: int) -> None:
        core = self._kube.core
        body = pods.build_master_service(self._job, self._namespace, port, self._owner)
        try:
            self._kube.call(
                "create",
                "services",
                core.create_namespaced_service,
                self._namespace,
                body,
                retry_for_s=30,
            )
            return
        except KubeCallError as e:
            if not e.conflict:
                raise
        name = pods.service_name(self._job)
        existing = self._kube.call(
            "get", "services", core.read_namespaced_service, name, self._namespace
        )
        wanted, spec = body["spec"], existing.get("spec") or {}

        def ports(items: list[dict[str, Any]]) -> list[tuple]:
            return [(p.get("name"), p.get("port"), p.get("targetPort")) for p in items]

        if spec.get("selector") == wanted["selector"] and ports(spec.get("ports") or []) == ports(
            wanted["ports"]
        ):
            return
        # A list body is sent as a JSON patch: the ports are replaced, not merged.
        self._kube.call(
            "patch",
            "services",
            core.patch_namespaced_service,
            name,
            self._namespace,
            [
                {"op": "replace", "path": "/spec/ports", "value": wanted["ports"]},
                {"op": "replace", "path": "/spec/selector", "value": wanted["selector"]},
            ],
        )

    def _find_listen_host(self) -> str:
        if os.environ.get("ELASTIC_STEP_POD_IP"):
            return os.environ["ELASTIC_STEP_POD_IP"]
        if self._master_pod is None:
            return address_toward(self._api_client)
        deadline = time.monotonic() + 30
        while True:
            pod = self._read_master_pod()
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                return ip
            if time.monotonic() > deadline:
                raise BackendError(f"the master's pod {self._master_pod} has no IP after 30 s")
            time.sleep(0.5)

    # -- create and delete, in the pool's threads --

    def _guarded(self, instance: _Instance, operation: Callable[[_Instance], None]) -> None:
        """Runs ``operation``; an unexpected error ends the instance rather than leaving it
        pending for ever."""
        try:
            operation(instance)
        except Exception as e:
            log.exception("kubernetes backend: %s of %s failed", operation.__name__, instance.name)
            self._end(
                instance, ExitReason.LOST, None, f"{operation.__name__.strip('_')} failed: {e}"
            )

    def _create(self, instance: _Instance) -> None:
        with instance.op_lock:
            if instance.ended:
                return
            if instance.delete_requested:
                self._end(instance, ExitReason.DELETED, None, "deleted before its pod was made")
                return
            instance.create_attempts += 1
            spec = instance.spec
            assert spec is not None
            try:
                self._ensure_setup()
                if spec.secret_env:
                    self._ensure_secret(spec)
                body = pods.build_pod(
                    spec,
                    self._options,
                    job_name=self._job,
                    namespace=self._namespace,
                    image=self._image or "",
                    owner=self._owner,
                )
                try:
                    made = self._kube.call(
                        "create",
                        "pods",
                        self._kube.core.create_namespaced_pod,
                        self._namespace,
                        body,
                    )
                except KubeCallError as e:
                    if not e.conflict:
                        raise
                    made = self._existing_pod(instance)
            except KubeCallError as e:
                self._create_failed(instance, e)
                return
            except BackendError as e:
                self._fail_create(instance, str(e))
                return
            answered = time.monotonic()
            with self._lock:
                instance.creating = False
                instance.uid = made["metadata"]["uid"]
                instance.exists_since = answered
                for pod in (made, self._seen.get(instance.pod_name)):
                    if pod is not None and pod["metadata"]["uid"] == instance.uid:
                        self._observe(instance, pod)
                tombstone = self._gone.get(instance.pod_name)
                if tombstone is not None and tombstone["metadata"]["uid"] == instance.uid:
                    self._observe(instance, tombstone, gone=True)

    def _existing_pod(self, instance: _Instance) -> dict[str, Any]:
        """After 409 AlreadyExists: the pod, if it is this instance's (an earlier attempt was
        made after all); BackendError if another pod has the name."""
        pod = self._kube.call(
            "get",
            "pods",
            self._kube.core.read_namespaced_pod,
            instance.pod_name,
            self._namespace,
            retry_for_s=30,
        )
        labels = pod["metadata"].get("labels") or {}
        if labels.get(pods.LABEL_JOB) != self._job or labels.get(pods.LABEL_INSTANCE) != (
            instance.name
        ):
            raise BackendError(
                f'cannot create pods in namespace "{self._namespace}": a pod named '
                f"{instance.pod_name} exists and is not instance {instance.name} of job {self._job}"
            )
        return pod

    def _create_failed(self, instance: _Instance, error: KubeCallError) -> None:
        if error.capacity:
            instance.quota_refusals += 1
            delay = QUOTA_RETRY_S[min(instance.quota_refusals, len(QUOTA_RETRY_S)) - 1]
            self._pending(instance, f"not created yet: {error}; retrying in {delay:.0f} s")
            self._pool.submit(lambda: self._guarded(instance, self._create), delay)
            return
        if error.transient:
            waited = time.monotonic() - instance.first_attempt
            if waited > self._create_retry_s:
                self._end(
                    instance,
                    ExitReason.LOST,
                    None,
                    f"not created: {error} (retried for {waited:.0f} s)",
                )
                return
            delay = backoff_s(instance.create_attempts, first_s=1.0, cap_s=30.0)
            if instance.create_attempts >= 2:
                self._pending(instance, f"not created yet: {error}; retrying")
            self._pool.submit(lambda: self._guarded(instance, self._create), delay)
            return
        self._fail_create(instance, str(error))

    def _fail_create(self, instance: _Instance, message: str) -> None:
        log.error("%s", message)
        self._end(instance, ExitReason.CRASHED, None, f"not created: {message}")

    def _delete(self, instance: _Instance) -> None:
        with instance.op_lock:
            with self._lock:
                if instance.ended:
                    return
                if instance.uid is None:
                    # Not made, and no create is under way (this holds its lock): a queued or
                    # retried create finds the instance ended and makes nothing.
                    self._end(instance, ExitReason.DELETED, None, "deleted before its pod was made")
                    return
                uid = instance.uid
            grace = max(1, math.ceil(instance.delete_grace_s))
            try:
                answer = self._kube.call(
                    "delete",
                    "pods",
                    self._kube.core.delete_namespaced_pod,
                    instance.pod_name,
                    self._namespace,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=grace,
                        preconditions=client.V1Preconditions(uid=uid),
                    ),
                )
            except KubeCallError as e:
                if e.not_found or e.conflict:
                    # Gone already (a 409 here: the uid precondition; the name is another's).
                    with self._lock:
                        self._end(instance, ExitReason.DELETED, None, "deleted by the master")
                    return
                if e.transient and time.monotonic() - instance.delete_since < DELETE_RETRY_S:
                    retry = lambda: self._guarded(instance, self._delete)  # noqa: E731
                    self._pool.submit(retry, backoff_s(2, cap_s=10))
                    return
                log.error("%s", e)
                with self._lock:
                    instance.deleting = False  # a later delete() tries again
                return
            if answer.get("kind") == "Pod":
                with self._lock:
                    self._observe(instance, answer)

    def _delete_pod(self, pod_name: str, uid: str | None, grace_s: int) -> None:
        """Deletes a pod whose instance has ended (best effort)."""
        try:
            self._kube.call(
                "delete",
                "pods",
                self._kube.core.delete_namespaced_pod,
                pod_name,
                self._namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=grace_s,
                    preconditions=client.V1Preconditions(uid=uid) if uid else None,
                ),
            )
        except KubeCallError as e:
            if not (e.not_found or e.conflict):
                log.warning("%s", e)

    # -- what the watch sees --

    def _on_watch_event(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                self._seen.pop(name, None)
                self._gone[name] = pod
                while len(self._gone) > 1000:
                    self._gone.popitem(last=False)
            else:
                self._seen[name] = pod
            instance = self._instance_of(pod)
            if instance is not None:
                self._observe(instance, pod, gone=kind == "DELETED")

    def _on_list(self, listed: dict[str, dict[str, Any]], sent_at: float) -> None:
        missed = []
        with self._lock:
            self._seen = dict(listed)
            for pod in listed.values():
                instance = self._instance_of(pod)
                if instance is not None:
                    self._observe(instance, pod)
            for instance in self._instances.values():
                if instance.ended or instance.uid is None:
                    continue
                pod = listed.get(instance.pod_name)
                if (pod is None or pod["metadata"]["uid"] != instance.uid) and (
                    instance.exists_since < sent_at
                ):
                    missed.append(instance)
        for instance in missed:
            self._report_missed_end(instance)

    def _instance_of(self, pod: dict[str, Any]) -> _Instance | None:
        labels = pod["metadata"].get("labels") or {}
        instance = self._instances.get(labels.get(pods.LABEL_INSTANCE, ""))
        if instance is None or instance.uid != pod["metadata"]["uid"]:
            return None
        return instance

    def _report_missed_end(self, instance: _Instance) -> None:
        """A pod that vanished while the watch was away (410 Gone): its last known state, or
        its Events, say how it ended; otherwise it is LOST."""
        last = instance.last_pod or {"metadata": {}, "status": {}}
        if instance.disruption or instance.delete_requested:
            state = pod_state(
                last,
                gone=True,
                deleted_by_master=instance.delete_requested,
                disruption=instance.disruption,
            )
            reason, message = state.reason, state.message
        else:
            reason, message = self._reason_from_events(instance)
        with self._lock:
            self._end(instance, reason, None, f"{message} (its end was seen by a relist)")

    def _reason_from_events(self, instance: _Instance) -> tuple[ExitReason, str]:
        try:
            events = self._kube.call(
                "list",
                "events",
                self._kube.core.list_namespaced_event,
                self._namespace,
                field_selector=f"involvedObject.uid={instance.uid}",
                timeout=(2.0, 5.0),
            )
        except KubeCallError as e:
            log.warning("%s", e)
            events = {}
        for event in events.get("items") or []:
            reason = event.get("reason")
            message = one_line(event.get("message") or "")
            if reason == "Preempted":
                return ExitReason.PREEMPTED, f"Preempted: {message}"
            if reason in ("Evicted", "TaintManagerEviction"):
                return ExitReason.EVICTED, f"{reason}: {message}"
        return ExitReason.LOST, "the pod was gone; how it ended is unknown"

    # -- events --

    def _adopt(self, pod: dict[str, Any], answered: float) -> _Instance | None:
        """Tracks a listed pod of the job from now on; None for one that is over, or not an
        instance's."""
        metadata = pod["metadata"]
        labels = metadata.get("labels") or {}
        try:
            name = labels[pods.LABEL_INSTANCE]
            role = Role(labels[pods.LABEL_ROLE])
            index = int(labels[pods.LABEL_INDEX])
        except (KeyError, ValueError):
            log.warning("ignoring pod %s: it lacks the labels of an instance", metadata["name"])
            return None
        instance = self._instances.get(name)
        if instance is not None:
            return instance if instance.uid == metadata["uid"] else None
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return None
        instance = _Instance(
            name,
            role,
            index,
            metadata["name"],
            uid=metadata["uid"],
            exists_since=answered,
            # The master takes an adopted instance for running: no STARTED for it.
            started=(pod.get("status") or {}).get("phase") == "Running",
        )
        self._instances[name] = instance
        return instance

    def _observe(self, instance: _Instance, pod: dict[str, Any], gone: bool = False) -> None:
        """Moves an instance forward (pending, started, ended) by one version of its pod.
        Called with the lock held. Never backward: versions may arrive out of order."""
        if instance.ended:
            return
        instance.last_pod = pod
        instance.disruption = disruption_of(pod) or instance.disruption
        metadata = pod.get("metadata") or {}
        if metadata.get("deletionTimestamp") and instance.terminating_deadline is None:
            grace = metadata.get("deletionGracePeriodSeconds") or 0
            instance.terminating_deadline = time.monotonic() + grace + self._terminating_timeout_s
        state = pod_state(
            pod,
            gone=gone,
            deleted_by_master=instance.delete_requested,
            disruption=instance.disruption,
        )
        if state.phase is Phase.PENDING:
            if not instance.started and state.message:
                self._pending(instance, state.message)
        elif state.phase is Phase.RUNNING:
            if not instance.started:
                instance.started = True
                self._events.put(InstanceEvent(instance.name, EventKind.STARTED))
        elif state.phase is Phase.ENDED:
            self._end(instance, state.reason, state.exit_code, state.message)
            running = (pod.get("status") or {}).get("phase") in ("Pending", "Running")
            if running and not gone and not metadata.get("deletionTimestamp"):
                # Its container is done but a sidecar runs on: the pod goes too.
                uid = metadata.get("uid")
                self._pool.submit(lambda: self._delete_pod(instance.pod_name, uid, 1))

    def _pending(self, instance: _Instance, message: str) -> None:
        with self._lock:
            if instance.ended or instance.started or message == instance.pending_message:
                return
            instance.pending_message = message
            self._events.put(InstanceEvent(instance.name, EventKind.PENDING, message=message))

    def _end(
        self, instance: _Instance, reason: ExitReason | None, code: int | None, message: str
    ) -> None:
        with self._lock:
            if instance.ended:
                return
            instance.ended = True
            instance.creating = instance.deleting = False
            self._events.put(InstanceEvent(instance.name, EventKind.EXITED, code, reason, message))
        if instance.spec is not None and instance.spec.secret_env:
            self._pool.submit(lambda: self._forget_secret(instance))

    def _end_stuck_terminating(self) -> None:
        now = time.monotonic()
        with self._lock:
            for instance in self._instances.values():
                deadline = instance.terminating_deadline
                if instance.ended or deadline is None or now < deadline:
                    continue
                who = "the master" if instance.delete_requested else "someone else"
                self._end(
                    instance,
                    ExitReason.LOST,
                    None,
                    f"stuck Terminating {self._terminating_timeout_s:.0f} s past its grace "
                    f"period (deleted by {who}; its node may be lost)",
                )
