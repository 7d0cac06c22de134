"""The ``kubernetes`` backend: the master, usually itself a pod in a pipeline step, runs its
workers and parameter servers as pods, with no operator.

**Objects.** Each instance is one pod, ``<job>-<instance>`` (names are never reused), with
``restartPolicy: Never``: the master replaces pods, the kubelet does not restart them. The
manifests are built in ``kubernetes_pods.py``; ``--dry-run`` prints the same ones. The job's
other objects (its Secret, the master's Service, and the owner of them all, which deleting
the run removes) and the master's own pod: see ``kubernetes_job_objects.py``.
:meth:`remove_job_objects` removes the pods, the Service and the Secret, never the owner.

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
from its last known state (or its Events, or as LOST). How each version of a pod moves its
instance (pending, started, ended, stuck Terminating): see ``kubernetes_instances.py``.

This module makes the calls that create, delete and list pods; ``kubernetes_instances.py``
keeps what they and the watch (``kubernetes_watch.py``) tell of each instance.

Tests: against an API server, tests/k8s/test_k8s_backend.py, test_k8s_backend_contract.py,
test_k8s_backend_job.py and test_k8s_backend_faults.py.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import (
    Backend,
    BackendError,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    JobOwner,
    LaunchSpec,
    StopRequest,
)
from elastic_step.backends.kubernetes_client import Kube, KubeCallError
from elastic_step.backends.kubernetes_instances import InstanceTracker, PodInstance
from elastic_step.backends.kubernetes_job_objects import JobObjects, master_pod_from_env
from elastic_step.backends.kubernetes_options import KubernetesOptions
from elastic_step.backends.kubernetes_run import RunWatch
from elastic_step.backends.kubernetes_watch import PodWatch, one_line, pod_state
from elastic_step.errors import InputError
from elastic_step.kube.calls import backoff_s, pod_delete_options
from elastic_step.kube.client import load_api_client

log = logging.getLogger(__name__)

#: Retry delays of a create refused for quota: 5, 10, 20, then every 30 s.
QUOTA_RETRY_S = (5.0, 10.0, 20.0, 30.0)
#: How long a delete is retried while the API does not answer.
DELETE_RETRY_S = 120.0
#: Seconds for the calls of :meth:`remove_job_objects`, all of them (the master's whole stop,
#: its waiting for instances included, must fit in 20 s).
REMOVE_DEADLINE_S = 10.0
_DETECT_FROM_ENV = object()


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
        self._namespace = self._options.namespace or namespace or "default"
        self._kube = Kube(api_client, self._namespace)
        self._master_pod: str | None = (
            master_pod_from_env(in_cluster) if master_pod is _DETECT_FROM_ENV else master_pod
        )
        if self._master_pod is None and self._options.image is None:
            raise InputError(
                "--image is required when the master does not run in a pod (in a pod, the "
                "default is the master pod's own image)"
            )
        self._create_retry_s = create_retry_s
        self._closed = False
        self._pool = _Pool(api_threads)
        self._run_watch = RunWatch(self._kube, self._master_pod, api_client)
        self._objects = JobObjects(
            self._kube, job_name, self._master_pod, self._options.image, self._run_watch.start
        )
        self._instances = InstanceTracker(
            terminating_timeout_s, on_end=self._ended, on_done_pod=self._done_pod
        )
        self._watch = PodWatch(
            self._kube, pods.job_selector(job_name), self._on_list, self._instances.on_watch_event
        )
        self._watch.start()

    @property
    def namespace(self) -> str:
        return self._namespace

    # -- the Backend interface --

    def launch(self, spec: LaunchSpec) -> None:
        # Checked here, so that a spec no pod can carry fails the launch, not a thread.
        pods.build_pod(
            spec, self._options, job_name=self._job, namespace=None, image="x", owner=None
        )
        instance = self._instances.new(spec, pods.pod_name(self._job, spec.name))
        if instance is not None:
            self._pool.submit(lambda: self._guarded(instance, self._create))

    def delete(self, name: str, grace_period_s: float = 5.0) -> None:
        instance = self._instances.request_delete(name, grace_period_s)
        if instance is not None:
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
        items = data.get("items") or []
        self._objects.note_adopted_keys(items)
        return self._instances.listed(items, time.monotonic())

    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        return self._instances.next_events(timeout_s)

    def listen_host(self) -> str:
        return self._objects.listen_host()

    def advertise_master(self, port: int) -> str:
        if self._master_pod is None:
            return f"{self.listen_host()}:{port}"
        return self._objects.advertise(port)

    def stop_request(self, signalled: bool = False) -> StopRequest | None:
        if not signalled:
            return self._run_watch.request()
        self._objects.ensure_setup()  # the run's object is found there
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
            self._instances.delete_requested(metadata["uid"])
            attempt(
                "delete",
                "pods",
                core.delete_namespaced_pod,
                metadata["name"],
                ns,
                body=pod_delete_options(uid=metadata["uid"], grace_s=0 if ended else 1),
            )
        service, secret = pods.service_name(self._job), pods.secret_name(self._job)
        attempt("delete", "services", core.delete_namespaced_service, service, ns)
        # Its EndpointSlice: no controller removes a slice that the master wrote itself.
        discovery = self._kube.discovery
        attempt("delete", "endpointslices", discovery.delete_namespaced_endpoint_slice, service, ns)
        attempt("delete", "secrets", core.delete_namespaced_secret, secret, ns)
        owner = self._objects.owner
        if owner is not None:
            log.info(
                "kubernetes: the state of job %s stays until %s %s is deleted",
                self._job,
                owner["kind"],
                owner["name"],
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watch.stop()
        self._run_watch.stop()
        self._pool.close()

    def owner(self) -> JobOwner | None:
        self._objects.ensure_setup()
        ref = self._objects.owner
        return JobOwner(
            api_version=ref["apiVersion"], kind=ref["kind"], name=ref["name"], uid=ref["uid"]
        )

    # -- create and delete, in the pool's threads --

    def _guarded(self, instance: PodInstance, operation: Callable[[PodInstance], None]) -> None:
        """Runs ``operation``; an unexpected error ends the instance rather than leaving it
        pending for ever."""
        try:
            operation(instance)
        except Exception as e:
            log.exception("kubernetes backend: %s of %s failed", operation.__name__, instance.name)
            self._instances.end(
                instance, ExitReason.LOST, None, f"{operation.__name__.strip('_')} failed: {e}"
            )

    def _create(self, instance: PodInstance) -> None:
        with instance.op_lock:
            if instance.ended:
                return
            if instance.delete_requested:
                self._instances.end(
                    instance, ExitReason.DELETED, None, "deleted before its pod was made"
                )
                return
            instance.create_attempts += 1
            spec = instance.spec
            assert spec is not None
            try:
                self._objects.ensure_setup()
                if spec.secret_env:
                    self._objects.ensure_secret(spec)
                body = pods.build_pod(
                    spec,
                    self._options,
                    job_name=self._job,
                    namespace=self._namespace,
                    image=self._objects.image or "",
                    owner=self._objects.owner,
                )
                try:
                    made = self._kube.create_pod(body)
                except KubeCallError as e:
                    if not e.already_exists:
                        raise
                    made = self._existing_pod(instance)
            except KubeCallError as e:
                self._create_failed(instance, e)
                return
            except BackendError as e:
                self._fail_create(instance, str(e))
                return
            self._instances.made(instance, made, time.monotonic())

    def _existing_pod(self, instance: PodInstance) -> dict[str, Any]:
        """After 409 AlreadyExists: the pod, if it is this instance's (an earlier attempt was
        made after all); BackendError if another pod has the name."""
        pod = self._kube.read_pod(instance.pod_name)
        labels = pod["metadata"].get("labels") or {}
        if labels.get(pods.LABEL_JOB) != self._job or labels.get(pods.LABEL_INSTANCE) != (
            instance.name
        ):
            raise BackendError(
                f'cannot create pods in namespace "{self._namespace}": a pod named '
                f"{instance.pod_name} exists and is not instance {instance.name} of job {self._job}"
            )
        return pod

    def _create_failed(self, instance: PodInstance, error: KubeCallError) -> None:
        if error.capacity:
            instance.quota_refusals += 1
            delay = QUOTA_RETRY_S[min(instance.quota_refusals, len(QUOTA_RETRY_S)) - 1]
            self._instances.pending(
                instance, f"not created yet: {error}; retrying in {delay:.0f} s"
            )
            self._pool.submit(lambda: self._guarded(instance, self._create), delay)
            return
        if error.transient:
            waited = time.monotonic() - instance.first_attempt
            if waited > self._create_retry_s:
                self._instances.end(
                    instance,
                    ExitReason.LOST,
                    None,
                    f"not created: {error} (retried for {waited:.0f} s)",
                )
                return
            delay = backoff_s(instance.create_attempts, first_s=1.0, cap_s=30.0)
            if instance.create_attempts >= 2:
                self._instances.pending(instance, f"not created yet: {error}; retrying")
            self._pool.submit(lambda: self._guarded(instance, self._create), delay)
            return
        self._fail_create(instance, str(error))

    def _fail_create(self, instance: PodInstance, message: str) -> None:
        log.error("%s", message)
        self._instances.end(instance, ExitReason.CRASHED, None, f"not created: {message}")

    def _delete(self, instance: PodInstance) -> None:
        with instance.op_lock:
            with self._instances.lock:
                if instance.ended:
                    return
                if instance.uid is None:
                    # Not made, and no create is under way (this holds its lock): a queued or
                    # retried create finds the instance ended and makes nothing.
                    self._instances.end(
                        instance, ExitReason.DELETED, None, "deleted before its pod was made"
                    )
                    return
                uid = instance.uid
            grace = max(1, math.ceil(instance.delete_grace_s))
            try:
                answer = self._kube.delete_pod(instance.pod_name, uid=uid, grace_s=grace)
            except KubeCallError as e:
                if e.not_found or e.conflict:
                    # Gone already (a 409 here: the uid precondition; the name is another's).
                    self._instances.end(instance, ExitReason.DELETED, None, "deleted by the master")
                    return
                if e.transient and time.monotonic() - instance.delete_since < DELETE_RETRY_S:
                    retry = lambda: self._guarded(instance, self._delete)  # noqa: E731
                    self._pool.submit(retry, backoff_s(2, cap_s=10))
                    return
                log.error("%s", e)
                with self._instances.lock:
                    instance.deleting = False  # a later delete() tries again
                return
            if answer.get("kind") == "Pod":
                self._instances.observe(instance, answer)

    def _delete_pod(self, pod_name: str, uid: str | None, grace_s: int) -> None:
        """Deletes a pod whose instance has ended (best effort)."""
        try:
            self._kube.delete_pod(pod_name, uid=uid, grace_s=grace_s)
        except KubeCallError as e:
            if not (e.not_found or e.conflict):
                log.warning("%s", e)

    # -- what follows from the instances --

    def _ended(self, instance: PodInstance) -> None:
        if instance.spec is not None and instance.spec.secret_env:
            self._pool.submit(lambda: self._objects.forget_secret(instance.spec))

    def _done_pod(self, pod_name: str, uid: str | None) -> None:
        self._pool.submit(lambda: self._delete_pod(pod_name, uid, 1))

    # -- what the watch sees --

    def _on_list(self, listed: dict[str, dict[str, Any]], sent_at: float) -> None:
        for instance in self._instances.on_list(listed, sent_at):
            self._report_missed_end(instance)

    def _report_missed_end(self, instance: PodInstance) -> None:
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
        self._instances.end(instance, reason, None, f"{message} (its end was seen by a relist)")

    def _reason_from_events(self, instance: PodInstance) -> tuple[ExitReason, str]:
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
