"""What the kubernetes backend knows of each instance and its pod, and the events that follow.

Every version of a pod (from the watch, a list, or the answer to a create or a delete) moves
its instance forward by ``kubernetes_watch.pod_state``, never backward: versions may arrive
out of order. STARTED is sent once the pod is Running; PENDING while it waits for a reason
worth telling (the scheduler's "Unschedulable: 0/3 nodes are available: ..." or an image pull
error); EXITED once, as ``pod_state`` reads it. A pod that stays Terminating
``terminating_timeout_s`` past its grace period (a lost node) ends as LOST; its replacement
has a new name, and the PS fence their writes, so a zombie cannot be confused with it.

No API call is made here: the backend (kubernetes.py) makes them, and is told through two
callbacks what follows from an instance's end (its keys leave the job's Secret) and from a
pod whose container is done while a sidecar runs on (the pod is deleted too).

Tests: tests/unit/test_kubernetes_instances.py; against an API server,
tests/k8s/test_k8s_backend.py.
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import (
    BackendError,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchSpec,
    Role,
    take_events,
)
from elastic_step.backends.kubernetes_watch import Phase, disruption_of, pod_state

log = logging.getLogger(__name__)

#: How many deleted pods' last states are kept, for versions that arrive after their end.
GONE_KEPT = 1000


@dataclass(eq=False)
class PodInstance:
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


class InstanceTracker:
    """The job's instances, the latest version of each of its pods, and the events queue.

    ``on_end(instance)`` is called once an instance has ended; ``on_done_pod(pod_name, uid)``
    for a pod to delete because its instance ended while the pod runs on. :attr:`lock` guards
    the instances: hold it to read and change several of an instance's fields together."""

    def __init__(
        self,
        terminating_timeout_s: float,
        *,
        on_end: Callable[[PodInstance], None],
        on_done_pod: Callable[[str, str | None], None],
    ) -> None:
        self._terminating_timeout_s = terminating_timeout_s
        self._on_end = on_end
        self._on_done_pod = on_done_pod
        self.lock = threading.RLock()
        self._instances: dict[str, PodInstance] = {}
        #: The watch's latest view of every pod of the job, and the last state of deleted ones.
        self._seen: dict[str, dict[str, Any]] = {}
        self._gone: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._events: queue.Queue[InstanceEvent] = queue.Queue()

    # -- what the backend asks for --

    def new(self, spec: LaunchSpec, pod_name: str) -> PodInstance | None:
        """A new instance to create; None when it is live already (a launch is idempotent).
        BackendError if the name was used before."""
        with self.lock:
            instance = self._instances.get(spec.name)
            if instance is not None:
                if not instance.ended:
                    return None
                raise BackendError(f"instance name {spec.name} was used before in this job")
            instance = PodInstance(
                spec.name,
                spec.role,
                spec.index,
                pod_name,
                spec=spec,
                creating=True,
                first_attempt=time.monotonic(),
            )
            self._instances[spec.name] = instance
            return instance

    def request_delete(self, name: str, grace_period_s: float) -> PodInstance | None:
        """Marks the instance to delete; None when there is nothing to do (unknown, ended, or
        a delete under way)."""
        with self.lock:
            instance = self._instances.get(name)
            if instance is None or instance.ended or instance.deleting:
                return None
            instance.delete_requested = instance.deleting = True
            instance.delete_grace_s = grace_period_s
            instance.delete_since = time.monotonic()
            return instance

    def delete_requested(self, uid: str) -> None:
        """The pod with ``uid`` is being deleted by the master: its end is no fault."""
        with self.lock:
            for instance in self._instances.values():
                if instance.uid == uid:
                    instance.delete_requested = True

    def listed(self, items: Iterable[dict[str, Any]], answered: float) -> list[InstanceInfo]:
        """Takes in a list of the job's pods (asked for before ``answered``); returns the live
        instances, by name."""
        live = []
        with self.lock:
            for pod in items:
                instance = self._adopt(pod, answered)
                if instance is not None:
                    # What the watch saw of it, before it was ours to report, counts too.
                    self._catch_up(instance, self._seen.get(instance.pod_name), pod)
            for instance in self._instances.values():
                if not instance.ended:
                    live.append(InstanceInfo(instance.name, instance.role, instance.index))
        return sorted(live, key=lambda i: i.name)

    def made(self, instance: PodInstance, pod: dict[str, Any], answered: float) -> None:
        """The instance's pod was created (or found), as ``pod``, by ``answered``."""
        with self.lock:
            instance.creating = False
            instance.uid = pod["metadata"]["uid"]
            instance.exists_since = answered
            self._catch_up(instance, pod, self._seen.get(instance.pod_name))

    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        self._end_stuck_terminating()
        return take_events(self._events, timeout_s)

    # -- what the watch sees --

    def on_watch_event(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self._seen.pop(name, None)
                self._gone[name] = pod
                while len(self._gone) > GONE_KEPT:
                    self._gone.popitem(last=False)
            else:
                self._seen[name] = pod
            instance = self._instance_of(pod)
            if instance is not None:
                self.observe(instance, pod, gone=kind == "DELETED")

    def on_list(self, listed: dict[str, dict[str, Any]], sent_at: float) -> list[PodInstance]:
        """Takes in the watch's list (asked for at ``sent_at``); returns the instances whose
        pods it should have shown and did not: they ended while the watch was away."""
        missed = []
        with self.lock:
            self._seen = dict(listed)
            for pod in listed.values():
                instance = self._instance_of(pod)
                if instance is not None:
                    self.observe(instance, pod)
            for instance in self._instances.values():
                if instance.ended or instance.uid is None:
                    continue
                pod = listed.get(instance.pod_name)
                if (pod is None or pod["metadata"]["uid"] != instance.uid) and (
                    instance.exists_since < sent_at
                ):
                    missed.append(instance)
        return missed

    def _instance_of(self, pod: dict[str, Any]) -> PodInstance | None:
        labels = pod["metadata"].get("labels") or {}
        instance = self._instances.get(labels.get(pods.LABEL_INSTANCE, ""))
        if instance is None or instance.uid != pod["metadata"]["uid"]:
            return None
        return instance

    def _catch_up(self, instance: PodInstance, *versions: dict[str, Any] | None) -> None:
        """Observes those of ``versions`` that are of the instance's pod, in order, then the
        pod's last state if the watch saw it deleted."""
        for pod in versions:
            if pod is not None and pod["metadata"]["uid"] == instance.uid:
                self.observe(instance, pod)
        tombstone = self._gone.get(instance.pod_name)
        if tombstone is not None and tombstone["metadata"]["uid"] == instance.uid:
            self.observe(instance, tombstone, gone=True)

    def _adopt(self, pod: dict[str, Any], answered: float) -> PodInstance | None:
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
        instance = PodInstance(
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

    # -- moving an instance forward --

    def observe(self, instance: PodInstance, pod: dict[str, Any], gone: bool = False) -> None:
        """Moves an instance forward (pending, started, ended) by one version of its pod.
        Never backward: versions may arrive out of order."""
        with self.lock:
            if instance.ended:
                return
            instance.last_pod = pod
            instance.disruption = disruption_of(pod) or instance.disruption
            metadata = pod.get("metadata") or {}
            if metadata.get("deletionTimestamp") and instance.terminating_deadline is None:
                grace = metadata.get("deletionGracePeriodSeconds") or 0
                instance.terminating_deadline = (
                    time.monotonic() + grace + self._terminating_timeout_s
                )
            state = pod_state(
                pod,
                gone=gone,
                deleted_by_master=instance.delete_requested,
                disruption=instance.disruption,
            )
            if state.phase is Phase.PENDING:
                if not instance.started and state.message:
                    self.pending(instance, state.message)
            elif state.phase is Phase.RUNNING:
                if not instance.started:
                    instance.started = True
                    self._events.put(InstanceEvent(instance.name, EventKind.STARTED))
            elif state.phase is Phase.ENDED:
                self.end(instance, state.reason, state.exit_code, state.message)
                running = (pod.get("status") or {}).get("phase") in ("Pending", "Running")
                if running and not gone and not metadata.get("deletionTimestamp"):
                    # Its container is done but a sidecar runs on: the pod goes too.
                    self._on_done_pod(instance.pod_name, metadata.get("uid"))

    def pending(self, instance: PodInstance, message: str) -> None:
        with self.lock:
            if instance.ended or instance.started or message == instance.pending_message:
                return
            instance.pending_message = message
            self._events.put(InstanceEvent(instance.name, EventKind.PENDING, message=message))

    def end(
        self, instance: PodInstance, reason: ExitReason | None, code: int | None, message: str
    ) -> None:
        with self.lock:
            if instance.ended:
                return
            instance.ended = True
            instance.creating = instance.deleting = False
            self._events.put(InstanceEvent(instance.name, EventKind.EXITED, code, reason, message))
        self._on_end(instance)

    def _end_stuck_terminating(self) -> None:
        now = time.monotonic()
        with self.lock:
            for instance in self._instances.values():
                deadline = instance.terminating_deadline
                if instance.ended or deadline is None or now < deadline:
                    continue
                who = "the master" if instance.delete_requested else "someone else"
                self.end(
                    instance,
                    ExitReason.LOST,
                    None,
                    f"stuck Terminating {self._terminating_timeout_s:.0f} s past its grace "
                    f"period (deleted by {who}; its node may be lost)",
                )
