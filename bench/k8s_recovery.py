"""Recovery from a deleted worker pod, with and without standbys, on the project's test
Kubernetes control plane.

The bench starts the test cluster (tests/cluster/local_cluster.py: a real control plane and
the process kubelet), makes a namespace that enforces the ``restricted`` Pod Security
Standard with the project's Role, and runs, one after the other, one real job per
``--standby`` value (default ``0,1``: without a standby, then with one): the digits, 2
workers, 1 PS, ``standby=N``; its master in this process's main thread through
``elastic_step.training.train`` with the Kubernetes backend, as ``elastic-step train --backend
kubernetes --standby N`` would, acting as the elastic-step-master ServiceAccount. In each job
a thread of the bench deletes a worker pod ``--deletions`` times, each once the previous
replacement has registered and trained, and, with standbys, once a standby is ready (it has
registered, and registered again from its wait for a slot: TensorFlow and the model are
loaded; the measured case is "a ready standby exists"). It times from just before each delete
call:

1. **re-queue**: the master has taken back the dead worker's tasks (the end of
   ``Coordinator._on_ended``, which calls ``TaskManager.recover_tasks``);
2. **replacement Running**: the replacement's pod reaches phase Running (a watch of the bench);
3. **replacement registered**: the replacement's Register call has been answered
   (``Coordinator.register``);
4. **replacement training**: ``Coordinator.next_task`` first answers the replacement with a
   TRAIN or EVALUATE task (not WAIT or FINISHED): the slot trains again.

The replacement is the instance that takes the dead worker's slot: the live worker of the
master's instance manager in that slot, other than the dead one. Without a ready standby it is
a new pod ``worker-N``; with one, the standby that the master moved into the slot
(``InstanceManager._promote_standby``, also timed: "promoted"), which keeps its name
``standby-K``. A promoted standby's pod was Running, and it had registered, before the
deletion: milestones 2 and 3 do not apply to it and are reported as n/a.

Side by side, in the same run: what Kubernetes itself takes, seen by an independent watch of
the bench (the deleted pod's first version with a deletionTimestamp; the first whose
container has terminated, the kubelet's report on which the master acts; its DELETED event),
and a bare pod made like a worker's (the backend's own pod builder, the same options) that
only imports what a worker imports before it registers (TensorFlow, Keras, elastic_step's
worker): create -> Running and create -> imports done. By default the bare pod is created
right after each delete call, so that it starts under the same load as the replacement. At
the end a table sets the jobs side by side: per ``--standby`` value the mean, median and each
deletion's time to re-queue, replacement Running, registered and training.

The master's moments are observed by wrapping its methods in this process only; the product
is unchanged. Every time is on this process's monotonic clock, except the bare pod's
"imports done" (wall clock, same machine). At the end of each job the bench stops it with
SIGTERM to itself (the master deletes the job's objects) and checks that no pod of it is left;
after the last, it stops the cluster. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import resource
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The test cluster's start (common puts this checkout's elastic_step first).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cluster"))
from common import (
    BenchError,
    children_cpu_s,
    distinct_ints,
    load_1min,
    log,
    machine_busy_s,
    run_header,
    start,
    wait_until,
    write_result,
)
from goodput import prepare_data
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from local_cluster import (
    Cluster,
    ClusterStartError,
    add_namespace,
    container_log,
    start_cluster,
)

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import LaunchSpec, Role
from elastic_step.backends.kubernetes_instances import InstanceTracker
from elastic_step.backends.kubernetes_options import KubernetesOptions, RoleResources
from elastic_step.errors import ElasticStepError
from elastic_step.master.config import TrainConfig
from elastic_step.master.instances.instance_manager import InstanceManager
from elastic_step.master.instances.process_state import ProcessState
from elastic_step.master.job_state.coordinator import Coordinator
from elastic_step.rpc import master_pb2

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAMESPACE = "es-bench"
#: The jobs' names start so; each job adds ``-s<standby count>``.
JOB = "k8s-recovery"
#: NextTask answers that set a worker training (the others: WAIT and FINISHED).
TRAINING_KINDS = (master_pb2.Task.TRAIN, master_pb2.Task.EVALUATE)
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
#: What a worker imports before it calls Register (python -m elastic_step worker, then
#: Worker.setup), then the time; the bare pod runs only this.
WORKER_IMPORTS = """
import json, time
import elastic_step.cli
from elastic_step.model.tf_runtime import configure_threads, import_tensorflow_quietly
import_tensorflow_quietly()
from elastic_step.worker import worker
configure_threads()
import keras, tensorflow
from elastic_step.data.schema import Schema
from elastic_step.model.definition import load_model_definition
from elastic_step.model.parameters import ModelParameters
print(json.dumps({"imported_at": time.time()}), flush=True)
"""


def _after_the_master(signum: int, frame: object) -> None:
    """SIGTERM's handler outside the master's run: the bench's own stop request may come just
    after the job ended (the master then no longer handles it), and must not kill the bench."""
    log(f"{signal.Signals(signum).name} received outside the master's run; ignored")


def own_cpu_s() -> float:
    """CPU seconds of this process: the master's and the bench's threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Observer:
    """Moments that one thread notes, under ``_changed``, and the bench's thread waits for."""

    def __init__(self) -> None:
        self._changed = threading.Condition()

    def _broken(self) -> str | None:
        """Why no moment will be noted any more, if none will."""
        return None

    def wait(
        self,
        what: str,
        found: Callable[[], Any],
        timeout: float,
        failure: Callable[[], str | None] = lambda: None,
    ) -> Any:
        """``found()``'s first truthy value, re-checked at every moment noted and at least every
        0.5 s (not every change notifies); a BenchError once ``timeout`` runs out, or with
        ``_broken()``'s or ``failure()``'s reason as soon as one gives one."""
        with self._changed:
            return wait_until(
                what,
                found,
                timeout,
                interval=0.5,
                failure=lambda: self._broken() or failure(),
                pause=self._changed.wait,
            )


# -- what Kubernetes shows: one watch of the namespace --


@dataclass
class PodMoments:
    """When the bench's watch first saw each stage of one pod (monotonic seconds)."""

    labels: dict[str, str]
    added: float
    running: float | None = None
    terminating: float | None = None  # the first version with a deletionTimestamp
    #: The first version whose container has terminated (or phase Succeeded or Failed): the
    #: kubelet's report that the process is gone, on which the master acts.
    terminal: float | None = None
    gone: float | None = None  # the DELETED event


def _terminal(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    containers = status.get("containerStatuses") or []
    return any((c.get("state") or {}).get("terminated") for c in containers)


class PodTimeline(Observer):
    """Lists the namespace's pods, then watches them in a thread, noting when each pod was
    added, Running, Terminating and gone. Independent of the master's own watch."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__()
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._pods: dict[str, PodMoments] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-timeline", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def moments(self, name: str) -> PodMoments | None:
        with self._changed:
            return self._pods.get(name)

    def _broken(self) -> str | None:
        """The watch failed: no event will come."""
        if self.error is not None:
            return f"the bench's pod watch failed: {self.error}"
        return None

    def wait_seen(
        self, pod_name: str, moment: str, timeout: float, failure: Callable[[], str | None]
    ) -> PodMoments:
        """The moments of pod ``pod_name`` once the watch has seen its ``moment`` ("running",
        "gone": a field of :class:`PodMoments`)."""
        return self.wait(
            f"pod {pod_name} {moment}",
            lambda: (m := self.moments(pod_name)) and getattr(m, moment) and m,
            timeout,
            failure,
        )

    def first_added_after(self, since: float, labels: dict[str, str]) -> str | None:
        """The name of the first pod added after ``since`` that carries ``labels``."""
        with self._changed:
            new = [
                (m.added, name)
                for name, m in self._pods.items()
                if m.added > since and labels.items() <= m.labels.items()
            ]
        return min(new)[1] if new else None

    def _note(self, kind: str, pod: dict[str, Any], at: float) -> None:
        metadata = pod["metadata"]
        with self._changed:
            moments = self._pods.setdefault(
                metadata["name"], PodMoments(dict(metadata.get("labels") or {}), at)
            )
            if moments.running is None and (pod.get("status") or {}).get("phase") == "Running":
                moments.running = at
            if moments.terminating is None and metadata.get("deletionTimestamp"):
                moments.terminating = at
            if moments.terminal is None and (kind == "DELETED" or _terminal(pod)):
                moments.terminal = at
            if kind == "DELETED" and moments.gone is None:
                moments.gone = at
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            version = self._list()
            while not self._stop.is_set():
                stream = watch.Watch()
                try:
                    for event in stream.stream(
                        self._core.list_namespaced_pod,
                        self._namespace,
                        resource_version=version,
                        timeout_seconds=5,  # so that stop() is prompt
                    ):
                        self._note(event["type"], event["raw_object"], time.monotonic())
                        version = event["raw_object"]["metadata"]["resourceVersion"]
                except ApiException as e:
                    if e.status != 410:
                        raise
                    version = self._list()  # too old: start again from a list
        except BaseException as e:  # the waiters report it
            with self._changed:
                self.error = e
                self._changed.notify_all()

    def _list(self) -> str:
        listed = self._core.list_namespaced_pod(self._namespace, _preload_content=False)
        body = json.loads(listed.data)
        now = time.monotonic()
        for pod in body["items"]:
            self._note("LISTED", pod, now)
        return body["metadata"]["resourceVersion"]


# -- what the master does: some of its methods, timed --


class MasterProbe(Observer):
    """Wraps methods of the master in this process and notes when they happened, per instance:
    ``Coordinator.register`` (each instance's first Register answered, and a standby's first
    Register after that one: it comes from its wait for a slot, once TensorFlow and the model
    are loaded), ``Coordinator._on_ended`` (which re-queues a dead worker's tasks through
    ``TaskManager.recover_tasks``), ``Coordinator.next_task`` (the first answer with a TRAIN or
    EVALUATE task), ``InstanceManager._promote_standby`` (which standby took which worker
    slot) and, to split the re-queue time, ``InstanceTracker.end`` of the Kubernetes backend
    (when the master's pod watch saw an end, before its event is queued). Installed once;
    :meth:`reset` before each job (instance names repeat)."""

    def __init__(self) -> None:
        super().__init__()
        self.coordinator: Coordinator | None = None
        self.registered: dict[str, float] = {}
        #: A standby's second Register answered: it is ready (in its wait for a slot).
        self.registered_again: dict[str, float] = {}
        #: instance -> (when its end was handled, tasks re-queued, why it ended)
        self.ended: dict[str, tuple[float, int, str]] = {}
        self.backend_ended: dict[str, float] = {}
        #: instance -> its first NextTask answered with a TRAIN or EVALUATE task
        self.first_task: dict[str, float] = {}
        #: standby -> (the worker slot it was moved into, when)
        self.promoted: dict[str, tuple[int, float]] = {}

    def reset(self) -> None:
        """Forgets every moment, before the next job."""
        with self._changed:
            self.coordinator = None
            for moments in (
                self.registered,
                self.registered_again,
                self.ended,
                self.backend_ended,
                self.first_task,
                self.promoted,
            ):
                moments.clear()

    def install(self) -> None:
        register, on_ended = Coordinator.register, Coordinator._on_ended
        next_task, promote = Coordinator.next_task, InstanceManager._promote_standby
        tracker_end = InstanceTracker.end
        probe = self

        def timed_end(tracker, instance, *args):
            with probe._changed:
                probe.backend_ended.setdefault(instance.name, time.monotonic())
            return tracker_end(tracker, instance, *args)

        def timed_register(coordinator, caller, request):
            reply = register(coordinator, caller, request)
            at = time.monotonic()
            with probe._changed:
                probe.coordinator = coordinator
                if request.name in probe.registered:
                    probe.registered_again.setdefault(request.name, at)
                probe.registered.setdefault(request.name, at)
                probe._changed.notify_all()
            return reply

        def timed_on_ended(coordinator, instance):
            worker = instance.role is Role.WORKER
            held = len(coordinator.tasks.tasks_of(instance.name)) if worker else 0
            on_ended(coordinator, instance)  # re-queues what ``held`` counted
            at = time.monotonic()
            with probe._changed:
                probe.ended.setdefault(instance.name, (at, held, instance.reason))
                probe._changed.notify_all()

        def timed_next_task(coordinator, caller, request):
            reply = next_task(coordinator, caller, request)
            if reply.kind in TRAINING_KINDS and request.worker not in probe.first_task:
                at = time.monotonic()
                with probe._changed:
                    probe.first_task.setdefault(request.worker, at)
                    probe._changed.notify_all()
            return reply

        def timed_promote(manager, slot):
            standbys = [n for n, i in manager.instances.items() if i.role is Role.STANDBY]
            promoted = promote(manager, slot)
            if promoted:
                at = time.monotonic()
                for name in standbys:
                    instance = manager.instances.get(name)
                    if instance is not None and instance.role is Role.WORKER:
                        with probe._changed:
                            probe.promoted.setdefault(name, (slot, at))
                            probe._changed.notify_all()
            return promoted

        Coordinator.register = timed_register
        Coordinator._on_ended = timed_on_ended
        Coordinator.next_task = timed_next_task
        InstanceManager._promote_standby = timed_promote
        InstanceTracker.end = timed_end

    def wait_noted(
        self, moment: str, name: str, timeout: float, failure: Callable[[], str | None]
    ) -> Any:
        """What the probe noted of instance ``name`` at ``moment`` ("registered", "ended",
        "first_task": one of its dicts), once it has."""
        noted = getattr(self, moment)
        return self.wait(f"{name} {moment}", lambda: noted.get(name), timeout, failure)

    def running_workers(self) -> list[str]:
        """Workers the master has running and that have registered."""
        coordinator = self.coordinator
        if coordinator is None:
            return []
        with coordinator.lock:
            live = coordinator.instances.live(Role.WORKER)
            names = [i.name for i in live if i.state is ProcessState.RUNNING]
        with self._changed:
            return sorted(n for n in names if n in self.registered)

    def ready_standbys(self) -> list[str]:
        """Live standbys that have registered twice: in their wait for a slot, everything
        loaded (the first Register comes before the model is built)."""
        coordinator = self.coordinator
        if coordinator is None:
            return []
        with coordinator.lock:
            names = [i.name for i in coordinator.instances.live(Role.STANDBY)]
        with self._changed:
            return sorted(n for n in names if n in self.registered_again)

    def slot_of(self, name: str) -> int:
        with self.coordinator.lock:
            return self.coordinator.instances.instances[name].slot

    def occupant(self, slot: int, other_than: str) -> str | None:
        """The live worker in worker slot ``slot`` other than ``other_than``, if any: the
        instance that took the slot (a new launch, or a promoted standby)."""
        with self.coordinator.lock:
            for name, instance in self.coordinator.instances.instances.items():
                taken = instance.role is Role.WORKER and instance.slot == slot
                if taken and not instance.state.ended and name != other_than:
                    return name
        return None

    def holds_task(self, worker: str) -> bool:
        coordinator = self.coordinator
        with coordinator.lock:
            return bool(coordinator.tasks.tasks_of(worker))


# -- the run --


@dataclass
class Deletion:
    """One deleted worker pod; every time is seconds from just before the delete call."""

    victim: str
    #: The victim's worker slot, which the replacement takes.
    slot: int | None = None
    tasks_requeued: int = 0
    end_reason: str = ""
    #: The master's watch saw the end (``InstanceTracker.end``, before the event queue).
    master_watch_s: float | None = None
    requeue_s: float | None = None
    watch_terminating_s: float | None = None
    watch_terminal_s: float | None = None
    watch_gone_s: float | None = None
    replacement: str | None = None
    #: The replacement is a standby moved into the slot (``InstanceManager._promote_standby``):
    #: its pod was created and Running, and it had registered, before the deletion, so the
    #: three ``replacement_created_s``, ``_running_s`` and ``_registered_s`` do not apply (None).
    promoted: bool = False
    #: delete -> the master moved the standby into the slot.
    promoted_s: float | None = None
    #: With standbys: how long the bench waited, before the delete call, for a ready standby
    #: (0 when one was ready at once).
    standby_wait_s: float | None = None
    #: A promoted standby: how long it had been ready (its second Register) before the delete.
    standby_ready_for_s: float | None = None
    replacement_created_s: float | None = None
    replacement_running_s: float | None = None
    replacement_registered_s: float | None = None
    #: delete -> the replacement's first NextTask answered with a TRAIN or EVALUATE task.
    replacement_training_s: float | None = None


@dataclass
class BarePod:
    """A pod like a worker's that only does a worker's imports; seconds from its create call."""

    name: str
    running_s: float | None = None
    imported_s: float | None = None


@dataclass
class Measurements:
    deletions: list[Deletion] = field(default_factory=list)
    bare_pods: list[BarePod] = field(default_factory=list)
    error: str | None = None


@dataclass
class Disrupter:
    """The bench's thread for one job: waits for the job to train, then per round runs a bare
    pod and deletes a worker pod (with standbys, once one is ready), timing both; at the end
    stops the job with SIGTERM to this process (the master, in the main thread, handles it)."""

    args: argparse.Namespace
    standby: int
    job: str
    cluster: Cluster
    options: KubernetesOptions
    probe: MasterProbe
    timeline: PodTimeline
    result: Measurements = field(default_factory=Measurements, init=False)
    job_over: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.args.seed)  # the same choices in every job
        self._thread = threading.Thread(
            target=self._run, name=f"disrupter-s{self.standby}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def join(self) -> bool:
        """Waits for the thread; says whether it has ended."""
        self._thread.join(timeout=60)
        return not self._thread.is_alive()

    def _job_ended(self) -> str | None:
        """A wait's failure: the job ended (the master returned) before what it waits for."""
        return "the job ended before the measurements did" if self.job_over.is_set() else None

    def _run(self) -> None:
        try:
            self._wait_training(expected={"worker-0", "worker-1"})
            with self.cluster.admin() as api, ThreadPoolExecutor(1, "bare-pod") as pool:
                core = client.CoreV1Api(api)
                for number in range(1, self.args.deletions + 1):
                    if self.job_over.is_set():
                        raise BenchError("the job ended before the measurements did")
                    if self.args.bare == "before":
                        self.result.bare_pods.append(self._bare_pod(number))
                        self.result.deletions.append(self._delete_one(core, number, None))
                    else:
                        self.result.deletions.append(self._delete_one(core, number, pool))
        except Exception as e:
            self.result.error = f"{type(e).__name__}: {e}"
            log(f"stopping early: {self.result.error}")
        finally:
            self._stop_job()

    def _stop_job(self) -> None:
        """SIGTERM to this process, once the master handles it: it stops every instance and
        deletes the job's objects."""

        def master_handles() -> bool:
            return signal.getsignal(signal.SIGTERM) is not _after_the_master

        with contextlib.suppress(BenchError):
            wait_until(
                "the master's SIGTERM handler",
                master_handles,
                self.args.wait_timeout,
                failure=self._job_ended,
            )
        if not self.job_over.is_set():
            log(f"stopping job {self.job}: SIGTERM to the master (this process)")
            os.kill(os.getpid(), signal.SIGTERM)

    def _wait_training(self, expected: set[str]) -> None:
        """Until ``expected`` workers run and each holds a task, then ``--pause`` more."""
        timeout = self.args.wait_timeout

        def training() -> bool:
            running = set(self.probe.running_workers())
            return expected <= running and all(self.probe.holds_task(w) for w in expected)

        what = f"training by {', '.join(sorted(expected))}"
        wait_until(what, training, timeout, failure=self._job_ended)
        time.sleep(self.args.pause)

    def _wait_standby_ready(self) -> float:
        """Until a standby is ready (registered, and registered again from its wait for a
        slot); returns the seconds waited."""
        started = time.monotonic()
        ready = wait_until(
            "ready standby",
            self.probe.ready_standbys,
            self.args.wait_timeout,
            interval=0.1,
            failure=self._job_ended,
        )
        waited = time.monotonic() - started
        log(f"standby ready: {', '.join(ready)} (waited {waited:.1f} s)")
        return round(waited, 4)

    def _bare_pod(self, number: int) -> BarePod:
        """Creates a pod as the backend would a worker's, that only does a worker's imports;
        times it to Running and to the imports done, then deletes it."""
        with self.cluster.admin() as api:
            return self._time_bare_pod(client.CoreV1Api(api), number)

    def _time_bare_pod(self, core: client.CoreV1Api, number: int) -> BarePod:
        name = f"imports-{number}"
        spec = LaunchSpec(name, Role.WORKER, 0, [sys.executable, "-c", WORKER_IMPORTS])
        pod = pods.build_pod(
            spec,
            self.options,
            job_name=f"{self.job}-bare",
            namespace=NAMESPACE,
            image=self.options.image,
            owner=None,
        )
        pod_name = pod["metadata"]["name"]
        result = BarePod(pod_name)
        wall, started = time.time(), time.monotonic()
        core.create_namespaced_pod(NAMESPACE, pod)
        try:
            self._time_bare_pod_run(core, pod_name, result, wall, started)
        finally:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
        log(
            f"bare pod {number}: Running after {result.running_s:.2f} s, a worker's imports "
            f"done after {result.imported_s:.2f} s"
        )
        return result

    def _time_bare_pod_run(
        self, core: client.CoreV1Api, pod_name: str, result: BarePod, wall: float, started: float
    ) -> None:
        timeout = self.args.wait_timeout
        moments = self.timeline.wait_seen(pod_name, "running", timeout, self._job_ended)
        result.running_s = moments.running - started

        def finished() -> client.V1Pod | None:
            read = core.read_namespaced_pod(pod_name, NAMESPACE)
            if read.status.phase == "Failed":
                raise BenchError(f"{pod_name} failed: {container_log(self.cluster.workdir, read)}")
            return read if read.status.phase == "Succeeded" else None

        done = wait_until(
            f"{pod_name} to finish", finished, timeout, interval=0.2, failure=self._job_ended
        )
        text = container_log(self.cluster.workdir, done)
        line = next(x for x in reversed(text.splitlines()) if x.startswith('{"imported_at"'))
        result.imported_s = json.loads(line)["imported_at"] - wall

    def _delete_one(
        self, core: client.CoreV1Api, number: int, pool: ThreadPoolExecutor | None
    ) -> Deletion:
        """Deletes a running worker's pod (with standbys, once one is ready) and times the
        recovery; with ``pool``, a bare pod is created right after the delete call, to start
        under the same load as the replacement."""
        args, probe, timeline = self.args, self.probe, self.timeline
        timeout, failure = args.wait_timeout, self._job_ended
        standby_wait = self._wait_standby_ready() if self.standby else None
        victim = self._rng.choice(probe.running_workers())
        slot = probe.slot_of(victim)
        pod_name = pods.pod_name(self.job, victim)
        result = Deletion(victim, slot, standby_wait_s=standby_wait)
        started = time.monotonic()
        core.delete_namespaced_pod(pod_name, NAMESPACE)
        bare = pool.submit(self._bare_pod, number) if pool else None

        def since(at: float | None) -> float | None:
            return None if at is None else round(at - started, 4)

        at, held, reason = probe.wait_noted("ended", victim, timeout, failure)
        result.requeue_s, result.tasks_requeued, result.end_reason = since(at), held, reason
        result.master_watch_s = since(probe.backend_ended.get(victim))
        gone = timeline.wait_seen(pod_name, "gone", timeout, failure)
        result.watch_terminating_s = since(gone.terminating)
        result.watch_terminal_s, result.watch_gone_s = since(gone.terminal), since(gone.gone)
        # Polled: the instance manager has no moment to wrap for a launch (its pod's creation
        # is timed by the bench's watch), and a promotion is timed by the probe.
        replacement = wait_until(
            f"instance in {victim}'s worker slot {slot}",
            lambda: probe.occupant(slot, victim),
            timeout,
            interval=0.02,
            failure=failure,
        )
        result.replacement = replacement
        promotion = probe.promoted.get(replacement)
        if promotion is not None:
            result.promoted, result.promoted_s = True, since(promotion[1])
            ready_at = probe.registered_again.get(replacement)
            result.standby_ready_for_s = None if ready_at is None else round(started - ready_at, 4)
            how = (
                f"standby {replacement} promoted after {result.promoted_s:.3f} s "
                "(already Running and registered)"
            )
        else:
            new_pod = pods.pod_name(self.job, replacement)
            running = timeline.wait_seen(new_pod, "running", timeout, failure)
            result.replacement_created_s = since(running.added)
            result.replacement_running_s = since(running.running)
            registered = probe.wait_noted("registered", replacement, timeout, failure)
            result.replacement_registered_s = since(registered)
            how = (
                f"{replacement} created {result.replacement_created_s:.2f} s, Running "
                f"{result.replacement_running_s:.2f} s, registered "
                f"{result.replacement_registered_s:.2f} s"
            )
        training = probe.wait_noted("first_task", replacement, timeout, failure)
        result.replacement_training_s = since(training)
        log(
            f"deletion {number}/{args.deletions} (--standby {self.standby}): {victim}, slot "
            f"{slot} ({held} task(s) re-queued after {result.requeue_s:.3f} s; the bench's "
            f"watch saw it Terminating after {result.watch_terminating_s:.3f} s, ended "
            f"{result.watch_terminal_s:.3f} s, DELETED {result.watch_gone_s:.3f} s); {how}; "
            f"training {result.replacement_training_s:.2f} s"
        )
        if bare is not None:
            self.result.bare_pods.append(bare.result(timeout=2 * args.wait_timeout))
        survivors = set(probe.running_workers()) - {victim}
        self._wait_training(expected=survivors | {replacement})
        return result


def run_master(
    args: argparse.Namespace, data_dir: str, options: KubernetesOptions, job: str, standby: int
) -> int:
    """``elastic-step train --standby N`` of the digits, in this thread (the master handles
    signals)."""
    from elastic_step.examples import path_of
    from elastic_step.training import train

    output = Path(args.workdir) / f"job-s{standby}"
    shutil.rmtree(output, ignore_errors=True)
    config = TrainConfig(
        model_def=path_of("digits"),
        data=data_dir,
        output=str(output),
        epochs=args.epochs,
        batch_size=32,
        workers=2,
        ps=1,
        seed=args.seed,
        backend="kubernetes",
        records_per_task=64,
        # Deletions are not the workers' fault and use no restart; this bounds the rest.
        max_restarts=3,
        standby=standby,
        job_name=job,
    )
    try:
        return train(config, options)
    except ElasticStepError as e:
        log(f"the job failed: {e}")
        return e.exit_code


def left_over(cluster: Cluster, job: str) -> list[str]:
    """Pods of the job still in the namespace, after the master's stop (up to 30 s)."""
    with cluster.admin() as api:
        core = client.CoreV1Api(api)

        def names() -> list[str]:
            items = core.list_namespaced_pod(NAMESPACE, label_selector=pods.job_selector(job))
            return [p.metadata.name for p in items.items]

        with contextlib.suppress(BenchError):
            wait_until("no pod of the job", lambda: not names(), 30, interval=0.5)
        return names()


@dataclass
class Variant:
    """One job of the bench: its ``--standby`` value and what came of it."""

    standby: int
    job: str
    result: Measurements
    master_exit_code: int | None = None
    pods_left_over: list[str] = field(default_factory=list)
    wall_s: float | None = None
    #: The bench's thread for the job ended in time (if not, no further job is run).
    thread_ended: bool = True


def run_variant(
    args: argparse.Namespace,
    standby: int,
    data_dir: str,
    cluster: Cluster,
    options: KubernetesOptions,
    probe: MasterProbe,
    timeline: PodTimeline,
) -> Variant:
    """One job with ``standby`` standbys, its deletions, its stop; its own master log."""
    job = f"{JOB}-s{standby}"
    master_log = Path(args.workdir) / f"master-s{standby}.log"
    handler = logging.FileHandler(master_log, mode="w")
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)-7s %(message)s", "%H:%M:%S")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    probe.reset()
    disrupter = Disrupter(args, standby, job, cluster, options, probe, timeline)
    variant = Variant(standby, job, disrupter.result)
    started = time.monotonic()
    disrupter.start()
    log(
        f"job {job} (--standby {standby}), its master in this process (log: {master_log}); "
        f"{args.deletions} deletions to come"
    )
    # The master replaces this handler while it runs, and puts it back after.
    signal.signal(signal.SIGTERM, _after_the_master)
    try:
        variant.master_exit_code = run_master(args, data_dir, options, job, standby)
    finally:
        disrupter.job_over.set()
        variant.thread_ended = disrupter.join()
    if not variant.thread_ended:
        stuck = f"the bench's thread of job {job} did not stop"
        log(stuck)
        variant.result.error = variant.result.error or stuck
    variant.wall_s = round(time.monotonic() - started, 1)
    code = variant.master_exit_code
    stopped = " (stopped by the bench, as planned)" if code == 128 + 15 else ""
    log(f"the master of {job} exited with status {code}{stopped}")
    variant.pods_left_over = left_over(cluster, job)
    if variant.pods_left_over:
        log(f"pods of {job} left after the master's stop: {', '.join(variant.pods_left_over)}")
    return variant


# -- figures --

#: The milestones set side by side across the jobs: key of Deletion -> label.
COMPARED = {
    "requeue_s": "(1) delete -> tasks re-queued",
    "replacement_running_s": "(2) delete -> replacement Running",
    "replacement_registered_s": "(3) delete -> replacement registered",
    "replacement_training_s": "(4) delete -> replacement training",
}
#: Milestones that do not apply to a promoted standby (it was Running and registered before).
NOT_FOR_PROMOTED = ("replacement_created_s", "replacement_running_s", "replacement_registered_s")


def stats(values: list[float | None]) -> dict[str, Any]:
    """Mean, median, max and count of the values present; ``each``: all of them, in order
    (None where there is none)."""
    present = [v for v in values if v is not None]
    each = [None if v is None else round(v, 4) for v in values]
    if not present:
        return {"mean": None, "median": None, "max": None, "n": 0, "each": each}
    return {
        "mean": round(statistics.fmean(present), 4),
        "median": round(statistics.median(present), 4),
        "max": round(max(present), 4),
        "n": len(present),
        "each": each,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def summarize(result: Measurements) -> dict[str, Any]:
    d, b = result.deletions, result.bare_pods
    figures = {
        "master_watch_s": stats([x.master_watch_s for x in d]),
        "requeue_s": stats([x.requeue_s for x in d]),
        "watch_terminating_s": stats([x.watch_terminating_s for x in d]),
        "watch_terminal_s": stats([x.watch_terminal_s for x in d]),
        "watch_gone_s": stats([x.watch_gone_s for x in d]),
        "promoted_s": stats([x.promoted_s for x in d]),
        "replacement_created_s": stats([x.replacement_created_s for x in d]),
        "replacement_running_s": stats([x.replacement_running_s for x in d]),
        "replacement_registered_s": stats([x.replacement_registered_s for x in d]),
        "replacement_training_s": stats([x.replacement_training_s for x in d]),
        "bare_running_s": stats([x.running_s for x in b]),
        "bare_imported_s": stats([x.imported_s for x in b]),
    }
    median = {name: f["median"] for name, f in figures.items()}
    ratios = {
        # Kubernetes' own time to report the pod's process ended (what the master acts on),
        # and the pod gone.
        "requeue_over_watch_terminal": ratio(median["requeue_s"], median["watch_terminal_s"]),
        "requeue_over_watch_gone": ratio(median["requeue_s"], median["watch_gone_s"]),
        "registered_over_bare_imported": ratio(
            median["replacement_registered_s"], median["bare_imported_s"]
        ),
        "training_over_bare_imported": ratio(
            median["replacement_training_s"], median["bare_imported_s"]
        ),
        "running_over_bare_running": ratio(
            median["replacement_running_s"], median["bare_running_s"]
        ),
    }
    # Each deletion against its own watch, and its own round's bare pod.
    per_deletion = {
        "requeue_over_watch_terminal": stats([ratio(x.requeue_s, x.watch_terminal_s) for x in d]),
        "registered_over_bare_imported": stats(
            [ratio(x.replacement_registered_s, y.imported_s) for x, y in zip(d, b, strict=False)]
        ),
        "training_over_bare_imported": stats(
            [ratio(x.replacement_training_s, y.imported_s) for x, y in zip(d, b, strict=False)]
        ),
    }
    return {
        "promoted": sum(x.promoted for x in d),
        "figures": figures,
        "ratios_of_medians": ratios,
        "ratios_per_deletion": per_deletion,
    }


def side_by_side(variants: list[Variant]) -> dict[str, Any]:
    """Per milestone of COMPARED, per job: mean, median, max, each deletion's time (None
    where it does not apply: ``not_applicable`` counts those), and the ratio of its median to
    the first job's."""
    table: dict[str, Any] = {}
    for key in COMPARED:
        row: dict[str, Any] = {}
        first: float | None = None
        for i, variant in enumerate(variants):
            d = variant.result.deletions
            figure = stats([getattr(x, key) for x in d])
            figure["not_applicable"] = sum(x.promoted for x in d) if key in NOT_FOR_PROMOTED else 0
            if i == 0:
                first = figure["median"]
            figure["median_over_first_job"] = ratio(figure["median"], first)
            row[f"standby_{variant.standby}"] = figure
        table[key] = row
    return table


def _number(v: float | None, width: int, digits: int = 3, absent: str = "-") -> str:
    return f"{absent:>{width}}" if v is None else f"{v:>{width}.{digits}f}"


def print_result(variant: Variant, summary: dict[str, Any], bare: str) -> None:
    result = variant.result
    print()
    print(
        f"== job {variant.job}, --standby {variant.standby}: recovery from a deleted worker "
        "pod (seconds from the delete call) =="
    )
    if variant.standby:
        print(
            "before each deletion a standby was ready (registered, and registering again from "
            "its wait for a slot: TensorFlow and the model loaded); n/a: the replacement is a "
            "promoted standby, created, Running and registered before the deletion"
        )
    header = (
        f"{'#':>2} {'victim':<11}{'tasks':>6}{'master watch':>13}{'re-queue':>10}"
        f"{'bench watch: Term.':>20}{'ended':>7}{'DELETED':>9}  {'replacement':<12}"
        f"{'promoted':>9}{'created':>8}{'Running':>9}{'registered':>12}{'training':>10}"
    )
    print(header)

    for i, x in enumerate(result.deletions, 1):
        na = "n/a" if x.promoted else "-"
        print(
            f"{i:>2} {x.victim:<11}{x.tasks_requeued:>6}{_number(x.master_watch_s, 13)}"
            f"{_number(x.requeue_s, 10)}{_number(x.watch_terminating_s, 20)}"
            f"{_number(x.watch_terminal_s, 7)}{_number(x.watch_gone_s, 9)}  "
            f"{x.replacement or '-':<12}{_number(x.promoted_s, 9)}"
            f"{_number(x.replacement_created_s, 8, 2, na)}"
            f"{_number(x.replacement_running_s, 9, 2, na)}"
            f"{_number(x.replacement_registered_s, 12, 2, na)}"
            f"{_number(x.replacement_training_s, 10, 2)}"
        )
    when = "created right after each delete call" if bare == "with" else "alone, before each"
    print(f"bare pods (a worker's imports only; {when}; seconds from the create call):")
    for x in result.bare_pods:
        print(f"   {x.name}: Running {x.running_s:.2f}, imports done {x.imported_s:.2f}")
    print(f"{'':<60}{'median':>8}{'max':>8}")
    labels = {
        "master_watch_s": "    delete -> the master's watch saw the end",
        "requeue_s": "(1) delete -> tasks re-queued by the master",
        "watch_terminating_s": "    delete -> Terminating seen (bench's watch)",
        "watch_terminal_s": "    delete -> container ended seen (bench's watch)",
        "watch_gone_s": "    delete -> DELETED seen (bench's watch)",
        "promoted_s": "    delete -> a standby moved into the slot",
        "replacement_running_s": "(2) delete -> replacement Running",
        "replacement_registered_s": "(3) delete -> replacement registered",
        "replacement_training_s": "(4) delete -> replacement training (first task)",
        "bare_running_s": "    bare pod: create -> Running",
        "bare_imported_s": "    bare pod: create -> imports done",
    }
    for key, label in labels.items():
        figure = summary["figures"][key]
        if figure["n"]:
            print(f"{label:<60}{figure['median']:>8.3f}{figure['max']:>8.3f}")
    r = summary["ratios_of_medians"]
    print(
        f"ratios of medians: re-queue / container ended seen {r['requeue_over_watch_terminal']}; "
        f"re-queue / DELETED seen {r['requeue_over_watch_gone']}; "
        f"registered / bare imports done {r['registered_over_bare_imported']}; "
        f"training / bare imports done {r['training_over_bare_imported']}; "
        f"replacement Running / bare Running {r['running_over_bare_running']}"
    )
    p = summary["ratios_per_deletion"]
    t, i = p["requeue_over_watch_terminal"], p["registered_over_bare_imported"]
    print(
        f"ratios per deletion (median, max): re-queue / container ended seen {t['median']}, "
        f"{t['max']}; registered / its round's bare imports done {i['median']}, {i['max']}"
    )
    if result.error:
        print(f"incomplete: {result.error}")


def print_side_by_side(variants: list[Variant], table: dict[str, Any], deletions: int) -> None:
    print()
    print(
        f"== deletion -> the slot training again, side by side: {deletions} deletions per job, "
        "seconds from the delete call =="
    )
    if any(v.standby for v in variants):
        print(
            "with standbys: a ready standby existed before each deletion (it had registered "
            "and was waiting for a slot, TensorFlow and the model loaded)"
        )
        print(
            "n/a: the replacement was a promoted standby, Running and registered before the "
            "deletion"
        )
    print(f"{'milestone':<38}{'standby':>8}{'mean':>8}{'median':>8}  each deletion")
    for key, label in COMPARED.items():
        for i, variant in enumerate(variants):
            figure = table[key][f"standby_{variant.standby}"]
            each = " ".join(
                ("n/a" if x.promoted and key in NOT_FOR_PROMOTED else "-")
                if v is None
                else f"{v:.3f}"
                for x, v in zip(variant.result.deletions, figure["each"], strict=True)
            )
            absent = "n/a" if figure["not_applicable"] and not figure["n"] else "-"
            mean, median = figure["mean"], figure["median"]
            print(
                f"{label if i == 0 else '':<38}{variant.standby:>8}"
                f"{_number(mean, 8, absent=absent)}{_number(median, 8, absent=absent)}  "
                f"{each or '-'}"
            )
    training = table["replacement_training_s"]
    if len(variants) > 1:
        parts = [
            f"--standby {v.standby}: {training[f'standby_{v.standby}']['median_over_first_job']}"
            for v in variants[1:]
        ]
        print(
            f"median time to training, against --standby {variants[0].standby}'s: "
            + "; ".join(parts)
        )


# -- main --


def standby_counts(text: str) -> list[int]:
    """``--standby``'s value: comma-separated standby counts, each >= 0, none twice."""
    return distinct_ints(text, minimum=0, what="standby counts")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="How fast the Kubernetes backend recovers from a deleted worker pod, on the "
        "test control plane (tests/cluster; needs Go for its first build), with and without "
        "standbys: one job per --standby value, one after the other, the same deletions in "
        "each; delete -> tasks re-queued, delete -> replacement Running, registered and "
        "training (its first task), side by side; against Kubernetes' own deletion latency "
        "and a bare pod doing a worker's imports. With standbys, each deletion waits for a "
        "ready standby (registered, TensorFlow and the model loaded), which then takes the "
        "dead worker's slot: Running and registered do not apply to it (n/a).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        default=str(HERE / "results" / "k8s-recovery"),
        help="scratch directory: the digits, the cluster's files and logs (cluster/), each "
        "job's output (job-sN/) and master log (master-sN.log, N the standby count), "
        "k8s_recovery.json",
    )
    parser.add_argument(
        "--standby",
        type=standby_counts,
        default="0,1",
        metavar="N[,N...]",
        help="the jobs to run, one after the other: their standby counts (elastic-step train "
        "--standby N), comma-separated; 0,1: without a standby, then with one",
    )
    parser.add_argument("--deletions", type=int, default=5, help="worker pods deleted per job")
    parser.add_argument(
        "--pause",
        type=float,
        default=5.0,
        help="seconds of training, once every worker holds a task, before each bare pod and "
        "each deletion (with standbys, a deletion also waits for a ready standby)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=1000,
        help="each job's epochs: enough to outlast the measurements; the bench stops the job "
        "when they are done",
    )
    parser.add_argument(
        "--bare",
        choices=["with", "before"],
        default="with",
        help="when the bare pod runs: 'with' each deletion (created right after the delete "
        "call, so it starts under the same load as the replacement, and each slows the other), "
        "or alone 'before' it (while both workers train)",
    )
    parser.add_argument("--worker-cpu", default="500m", help="CPU of worker, standby and bare pods")
    parser.add_argument("--ps-cpu", default="500m", help="CPU of the PS pod")
    parser.add_argument(
        "--seed", type=int, default=7, help="job seed; choice of victims (the same in each job)"
    )
    parser.add_argument(
        "--wait-timeout", type=float, default=180.0, help="bound on each wait of the bench, s"
    )
    args = parser.parse_args(argv)
    if args.deletions < 1:
        parser.error(f"--deletions must be >= 1, got {args.deletions}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start(args)
    workdir = Path(args.workdir)
    log(
        f"load average {load_1min()} ({os.cpu_count()} CPUs); results in {workdir}; jobs with "
        f"--standby {', '.join(map(str, args.standby))}, {args.deletions} deletions each"
    )
    data_dir = prepare_data(str(workdir))

    from elastic_step.model.tf_runtime import import_tensorflow_quietly

    import_tensorflow_quietly()  # as the CLI does, before the master imports Keras
    # Until the first job: the cluster's start (each job then logs to its own master-sN.log).
    logging.basicConfig(
        level=logging.INFO,
        handlers=[logging.FileHandler(workdir / "bench.log", mode="w")],
        force=True,
    )

    cluster_dir = workdir / "cluster"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    cluster_dir.mkdir()
    load_before = load_1min()
    started = time.monotonic()
    busy0, ours0 = machine_busy_s(), own_cpu_s() + children_cpu_s()
    variants: list[Variant] = []
    try:
        with start_cluster(cluster_dir, host_paths=[workdir]) as cluster:
            cluster_s = time.monotonic() - started
            log(f"test cluster ready in {cluster_s:.1f} s ({cluster_dir})")
            kubeconfig = add_namespace(
                cluster.admin_kubeconfig,
                NAMESPACE,
                workdir / f"{NAMESPACE}-master.kubeconfig",
                labels=RESTRICTED,
            )
            options = KubernetesOptions(
                namespace=NAMESPACE,
                kubeconfig=str(kubeconfig),
                image="local/process",
                worker=RoleResources(cpu=args.worker_cpu),
                ps=RoleResources(cpu=args.ps_cpu),
                # The process kubelet runs pods on this machine: they import this checkout.
                env={"PYTHONPATH": str(REPO)},
            )
            probe = MasterProbe()
            probe.install()
            with cluster.admin() as api:
                timeline = PodTimeline(api, NAMESPACE)
                timeline.start()
                try:
                    for standby in args.standby:
                        variant = run_variant(
                            args, standby, data_dir, cluster, options, probe, timeline
                        )
                        variants.append(variant)
                        if not variant.thread_ended:
                            log("no further job: the bench's thread of this one is still busy")
                            break
                finally:
                    timeline.stop()
    except ClusterStartError as e:
        log(f"the test cluster did not start: {e}")
        return 1
    # The cluster is stopped: its processes and the pods' were waited for, so their CPU time
    # is in children_cpu_s(); the master's and the bench's in own_cpu_s().
    wall = time.monotonic() - started
    busy = machine_busy_s() - busy0
    ours = own_cpu_s() + children_cpu_s() - ours0
    cpu = {
        "wall_s": round(wall, 1),
        "bench_cpu_s": round(ours, 1),
        "machine_busy_cores": round(busy / wall, 2),
        "other_cores": round((busy - ours) / wall, 2),
    }
    summaries = [summarize(v.result) for v in variants]
    table = side_by_side(variants)
    errors = [f"--standby {v.standby}: {v.result.error}" for v in variants if v.result.error]
    missing = [str(n) for n in args.standby[len(variants) :]]
    if missing:
        errors.append(f"not run: --standby {', '.join(missing)}")
    document = {
        **run_header(),
        "settings": vars(args),
        "cluster_start_s": round(cluster_s, 2),
        "load_before": load_before,
        "load_after": load_1min(),
        "cpu": cpu,
        "error": "; ".join(errors) or None,
        # With standbys, each deletion came once a standby was ready (registered, and waiting
        # for a slot with TensorFlow and the model loaded).
        "standby_ready_before_each_deletion": True,
        "variants": [
            {
                "standby": v.standby,
                "job": v.job,
                "wall_s": v.wall_s,
                "master_exit_code": v.master_exit_code,
                "pods_left_over": v.pods_left_over,
                "error": v.result.error,
                "deletions": [asdict(d) for d in v.result.deletions],
                "bare_pods": [asdict(b) for b in v.result.bare_pods],
                **summary,
            }
            for v, summary in zip(variants, summaries, strict=True)
        ],
        "side_by_side": table,
    }
    path = workdir / "k8s_recovery.json"
    write_result(str(path), document)
    for variant, summary in zip(variants, summaries, strict=True):
        print_result(variant, summary, args.bare)
    print_side_by_side(variants, table, args.deletions)
    print()
    print(
        f"whole run {wall:.0f} s: the bench (cluster, pods, master) used {ours:.0f} CPU-s; "
        f"machine {cpu['machine_busy_cores']:.2f} cores busy, others "
        f"{cpu['other_cores']:.2f}; load {load_before} -> {document['load_after']}"
    )
    if document["error"]:
        print(f"incomplete: {document['error']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
