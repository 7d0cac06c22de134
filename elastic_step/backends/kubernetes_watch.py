"""What a pod's state means to the master, and the watch that follows the job's pods.

:func:`pod_state` reads one pod object (a JSON dict, as the API serves it) into a
:class:`PodState`: still pending (and why), running, or ended (with an :class:`ExitReason`).
An end is read in this order, the first that applies:

1. a ``DisruptionTarget`` condition: ``PreemptionByScheduler`` is PREEMPTED;
   ``EvictionByEvictionAPI``, ``TerminationByKubelet``, ``DeletionByTaintManager`` (and any
   other) are EVICTED; ``DeletionByPodGC`` (its node is gone) is LOST;
2. phase Failed with reason ``Evicted`` (node-pressure eviction): EVICTED;
3. deleted (a ``deletionTimestamp``, or the object is gone) or asked to stop by the master:
   DELETED, whose message says whether the master asked;
4. the container's termination: ``OOMKilled`` is OOM_KILLED, exit status 0 COMPLETED, any
   other status or a signal CRASHED;
5. phase Failed with no container status (the node refused the pod): LOST.

The instance ends when its pod does, or when its own container (``main``) has terminated
while a sidecar keeps the pod Running.

Only 4 is the program's own fault. :class:`PodWatch` lists the job's pods and watches them
from the list's resourceVersion; on 410 Gone it lists again and the backend compares, so an
end that happened while nobody watched is still reported.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from elastic_step.backends.api import ExitReason
from elastic_step.backends.kubernetes_client import Kube, KubeCallError
from elastic_step.backends.kubernetes_pods import CONTAINER
from elastic_step.kube.calls import backoff_s

log = logging.getLogger(__name__)

PREEMPTION_REASONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
#: Waiting reasons that are part of every start, not worth a PENDING event.
_ORDINARY_WAITS = frozenset({"ContainerCreating", "PodInitializing"})


class Phase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    ENDED = "ended"
    #: Nothing to report (phase Unknown).
    NONE = "none"


@dataclass(frozen=True)
class PodState:
    phase: Phase
    #: Why it waits (PENDING; empty for the ordinary steps of a start) or how it ended.
    message: str = ""
    reason: ExitReason | None = None
    exit_code: int | None = None


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def disruption_of(pod: dict[str, Any]) -> tuple[str, str] | None:
    """The (reason, message) of the pod's DisruptionTarget condition, if it is True."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return condition.get("reason") or "DisruptionTarget", one_line(
                condition.get("message") or ""
            )
    return None


def _main_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return status
    return statuses[0] if statuses else None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    status = _main_status(pod)
    if status is None:
        return None
    return (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get(
        "terminated"
    )


def describe_termination(terminated: dict[str, Any]) -> str:
    code = terminated.get("exitCode")
    sig = terminated.get("signal") or (code - 128 if isinstance(code, int) and code > 128 else 0)
    text = f"exit status {code}"
    if sig:
        try:
            text += f", {signal.Signals(sig).name}"
        except ValueError:
            text += f", signal {sig}"
    reason = terminated.get("reason")
    if reason and reason not in ("Error", "Completed"):
        text = f"{reason}, {text}"
    message = one_line(terminated.get("message") or "")
    return f"{text}: {message}" if message else text


def pending_message(pod: dict[str, Any]) -> str:
    """Why a Pending pod waits: a container's waiting reason or the scheduler's; "" while it
    is only being created."""
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason and reason not in _ORDINARY_WAITS:
                return one_line(f"{reason}: {waiting.get('message') or ''}").rstrip(": ")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "NotScheduled"
            return one_line(f"{reason}: {condition.get('message') or ''}").rstrip(": ")
    return ""


def pod_state(
    pod: dict[str, Any],
    *,
    gone: bool = False,
    deleted_by_master: bool = False,
    disruption: tuple[str, str] | None = None,
) -> PodState:
    """What one pod object says (see the module docstring). ``gone``: the object was deleted;
    ``deleted_by_master``: the master asked for it to stop; ``disruption``: a DisruptionTarget
    seen on an earlier version of the pod."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    main = _main_status(pod) or {}
    # A sidecar may keep the pod Running after the instance's own container has ended.
    main_ended = bool((main.get("state") or {}).get("terminated"))
    if phase not in ("Succeeded", "Failed") and not gone and not main_ended:
        if phase == "Running":
            return PodState(Phase.RUNNING)
        if phase == "Pending":
            return PodState(Phase.PENDING, pending_message(pod))
        return PodState(Phase.NONE)
    terminated = _terminated(pod)
    code = terminated.get("exitCode") if terminated else None
    how = describe_termination(terminated) if terminated else ""
    after = f" ({how})" if how else ""
    disruption = disruption_of(pod) or disruption
    if disruption is not None:
        kind, message = disruption
        if kind in PREEMPTION_REASONS:
            reason = ExitReason.PREEMPTED
        elif kind == "DeletionByPodGC":
            reason = ExitReason.LOST
        else:
            reason = ExitReason.EVICTED
        return PodState(Phase.ENDED, one_line(f"{kind}: {message}{after}"), reason, code)
    if status.get("reason") == "Evicted":
        message = one_line(f"Evicted: {status.get('message') or ''}{after}")
        return PodState(Phase.ENDED, message, ExitReason.EVICTED, code)
    deleted = gone or bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    if deleted_by_master:
        return PodState(Phase.ENDED, f"deleted by the master{after}", ExitReason.DELETED, code)
    if deleted:
        message = f"deleted by a user or a controller, not by the master{after}"
        return PodState(Phase.ENDED, message, ExitReason.DELETED, code)
    if terminated is not None:
        if terminated.get("reason") == "OOMKilled":
            return PodState(Phase.ENDED, how, ExitReason.OOM_KILLED, code)
        if code == 0:
            return PodState(Phase.ENDED, how, ExitReason.COMPLETED, 0)
        return PodState(Phase.ENDED, how, ExitReason.CRASHED, code)
    if phase == "Succeeded":
        return PodState(Phase.ENDED, "succeeded", ExitReason.COMPLETED, 0)
    message = one_line(
        f"refused by its node: {status.get('reason') or 'Failed'}: {status.get('message') or ''}"
    )
    return PodState(Phase.ENDED, message.rstrip(": "), ExitReason.LOST, None)


class _Gone(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class PodWatch:
    """Lists the pods that match a label selector, then watches them from the list's
    resourceVersion, in a daemon thread, until :meth:`stop`.

    ``on_list(pods, sent_at)`` gets every listed pod by name and the monotonic time the list
    was asked for; ``on_event(type, pod)`` gets each ADDED, MODIFIED or DELETED pod. Failures
    are retried with a capped backoff; 410 Gone lists again.
    """

    def __init__(
        self,
        kube: Kube,
        selector: str,
        on_list: Callable[[dict[str, dict[str, Any]], float], None],
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        watch_timeout_s: int = 60,
        backoff_cap_s: float = 10.0,
    ) -> None:
        self._kube = kube
        self._selector = selector
        self._on_list = on_list
        self._on_event = on_event
        self._watch_timeout_s = watch_timeout_s
        self._backoff_cap_s = backoff_cap_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: urllib3.HTTPResponse | None = None
        self._response_lock = threading.Lock()
        #: Lists so far (410s and restarts included), for tests and logs.
        self.lists = 0

    def start(self, resource_version: str | None = None) -> None:
        """Starts watching: from ``resource_version``, or after a fresh list when None."""
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._run, args=(resource_version,), name="kubernetes-pod-watch", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        with self._response_lock:
            if self._response is not None:
                with contextlib.suppress(Exception):  # best effort
                    self._response.shutdown()  # unblocks the read
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, resource_version: str | None) -> None:
        failures = 0
        last_logged = 0.0
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    resource_version = self._list()
                resource_version = self._watch(resource_version)
                failures = 0
            except _Gone:
                log.info("pod watch: resourceVersion too old (410 Gone); listing again")
                resource_version = None
            except Exception as e:
                if self._stopping.is_set():
                    return
                failures += 1
                now = time.monotonic()
                if now - last_logged > 30:
                    log.warning("pod watch failed (%s); retrying", one_line(str(e)))
                    last_logged = now
                self._stopping.wait(backoff_s(failures, cap_s=self._backoff_cap_s))

    def _list(self) -> str:
        sent = time.monotonic()
        data = self._kube.call(
            "list",
            "pods",
            self._kube.core.list_namespaced_pod,
            self._kube.namespace,
            label_selector=self._selector,
        )
        self.lists += 1
        pods = {p["metadata"]["name"]: p for p in data.get("items") or []}
        self._on_list(pods, sent)
        return data["metadata"]["resourceVersion"]

    def _watch(self, resource_version: str) -> str:
        try:
            response = self._kube.core.list_namespaced_pod(
                self._kube.namespace,
                label_selector=self._selector,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout_s,
                _preload_content=False,
                _request_timeout=(5.0, self._watch_timeout_s + 15.0),
            )
        except ApiException as e:
            if e.status == 410:
                raise _Gone() from e
            raise KubeCallError(
                "watch", "pods", self._kube.namespace, e.status, str(e.reason)
            ) from e
        with self._response_lock:
            self._response = response
        try:
            for line in iter_resp_lines(response):
                if self._stopping.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    code, message = obj.get("code"), obj.get("message", "")
                    raise KubeCallError("watch", "pods", self._kube.namespace, code, message)
                resource_version = obj["metadata"]["resourceVersion"]
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_event(kind, obj)
        finally:
            with self._response_lock:
                self._response = None
            response.release_conn()
        return resource_version
