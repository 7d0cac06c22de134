"""Recovery from a deleted worker pod, on the project's test Kubernetes control plane.

The bench starts the test cluster (tests/cluster/local_cluster.py: a real control plane and
the process kubelet), makes a namespace that enforces the ``restricted`` Pod Security
Standard with the project's Role, and runs the master of a real job (the digits, 2 workers,
1 PS) in this process's main thread through ``elastic_step.training.train`` with the
Kubernetes backend, as ``elastic-step train --backend kubernetes`` would, acting as the
elastic-step-master ServiceAccount. A thread of the bench deletes a worker pod ``--deletions``
times, each once the previous replacement has registered and trained, and times from just
before each delete call:

1. **re-queue**: the master has taken back the dead worker's tasks (the end of
   ``Coordinator._on_ended``, which calls ``TaskManager.recover_tasks``);
2. **replacement Running**: the replacement's pod reaches phase Running (a watch of the bench);
3. **replacement registered**: the replacement's Register call has been answered
   (``Coordinator.register``).

Side by side, in the same run: what Kubernetes itself takes, seen by an independent watch of
the bench (the deleted pod's first version with a deletionTimestamp; the first whose
container has terminated, the kubelet's report on which the master acts; its DELETED event),
and a bare pod made like a worker's (the backend's own pod builder, the same options) that
only imports what a worker imports before it registers (TensorFlow, Keras, elastic_step's
worker): create -> Running and create -> imports done. By default the bare pod is created
right after each delete call, so that it starts under the same load as the replacement.

The master's moments are observed by wrapping its methods in this process only; the product
is unchanged. Every time is on this process's monotonic clock, except the bare pod's
"imports done" (wall clock, same machine). At the end the bench stops the job with SIGTERM to
itself (the master deletes the job's objects), checks that no pod of it is left, and stops
the cluster. See bench/README.md.
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
    children_cpu_s,
    load_1min,
    log,
    machine_busy_s,
    run_header,
    start,
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
from elastic_step.backends.kubernetes import KubernetesBackend
from elastic_step.backends.kubernetes_options import KubernetesOptions, RoleResources
from elastic_step.errors import ElasticStepError
from elastic_step.master.config import TrainConfig
from elastic_step.master.coordinator import Coordinator
from elastic_step.master.process_state import ProcessState

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAMESPACE = "es-bench"
JOB = "k8s-recovery"
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


class BenchError(Exception):
    """A step of the bench did not happen, or not in time; the message says which."""


def own_cpu_s() -> float:
    """CPU seconds of this process: the master's and the bench's threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def wait_on(
    changed: threading.Condition,
    what: str,
    found: Callable[[], Any],
    timeout: float,
    failure: Callable[[], str | None] = lambda: None,
) -> Any:
    """``found()``'s first truthy value, re-checked whenever ``changed`` is notified and at
    least every 0.5 s (not every change notifies); a BenchError once ``timeout`` runs out, or
    with ``failure()``'s reason as soon as it gives one."""
    deadline = time.monotonic() + timeout
    with changed:
        while True:
            value = found()
            if value:
                return value
            reason = failure()
            if reason is not None:
                raise BenchError(reason)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no {what} within {timeout:.0f} s")
            changed.wait(min(left, 0.5))


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.05):
    """check()'s first truthy value, polled; BenchError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise BenchError(f"no {what} within {timeout:.0f} s")


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


class PodTimeline:
    """Lists the namespace's pods, then watches them in a thread, noting when each pod was
    added, Running, Terminating and gone. Independent of the master's own watch."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._pods: dict[str, PodMoments] = {}
        self._changed = threading.Condition()
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

    def wait(self, what: str, found: Callable[[], Any], timeout: float) -> Any:
        """``found()``'s first truthy value, re-checked at every watch event."""

        def failure() -> str | None:
            return None if self.error is None else f"the bench's pod watch failed: {self.error}"

        return wait_on(self._changed, what, found, timeout, failure)

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


# -- what the master does: two of its methods, timed --


class MasterProbe:
    """Wraps ``Coordinator.register`` and ``Coordinator._on_ended`` (which re-queues a dead
    worker's tasks through ``TaskManager.recover_tasks``) in this process, noting when each
    instance first registered and when each ended instance's tasks were re-queued; and, to
    split the re-queue time, ``KubernetesBackend._end``: when the master's watch saw an end."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.coordinator: Coordinator | None = None
        self.registered: dict[str, float] = {}
        #: instance -> (when its end was handled, tasks re-queued, why it ended)
        self.ended: dict[str, tuple[float, int, str]] = {}
        self.backend_ended: dict[str, float] = {}

    def install(self) -> None:
        register, on_ended = Coordinator.register, Coordinator._on_ended
        backend_end = KubernetesBackend._end
        probe = self

        def timed_end(backend, instance, *args):
            with probe._changed:
                probe.backend_ended.setdefault(instance.name, time.monotonic())
            return backend_end(backend, instance, *args)

        def timed_register(coordinator, caller, request):
            reply = register(coordinator, caller, request)
            at = time.monotonic()
            with probe._changed:
                probe.coordinator = coordinator
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

        Coordinator.register = timed_register
        Coordinator._on_ended = timed_on_ended
        KubernetesBackend._end = timed_end

    def wait(self, what: str, found: Callable[[], Any], timeout: float) -> Any:
        """``found()``'s first truthy value, re-checked at every moment noted."""
        return wait_on(self._changed, what, found, timeout)

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

    def holds_task(self, worker: str) -> bool:
        coordinator = self.coordinator
        with coordinator.lock:
            return bool(coordinator.tasks.tasks_of(worker))


# -- the run --


@dataclass
class Deletion:
    """One deleted worker pod; every time is seconds from just before the delete call."""

    victim: str
    tasks_requeued: int = 0
    end_reason: str = ""
    #: The master's watch saw the end (``KubernetesBackend._end``, before the event queue).
    master_watch_s: float | None = None
    requeue_s: float | None = None
    watch_terminating_s: float | None = None
    watch_terminal_s: float | None = None
    watch_gone_s: float | None = None
    replacement: str | None = None
    replacement_created_s: float | None = None
    replacement_running_s: float | None = None
    replacement_registered_s: float | None = None


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


class Disrupter:
    """The bench's thread: waits for the job to train, then per round runs a bare pod and
    deletes a worker pod, timing both; at the end stops the job with SIGTERM to this process
    (the master, in the main thread, handles it)."""

    def __init__(
        self,
        args: argparse.Namespace,
        cluster: Cluster,
        options: KubernetesOptions,
        probe: MasterProbe,
        timeline: PodTimeline,
    ) -> None:
        self.args = args
        self.cluster = cluster
        self.options = options
        self.probe = probe
        self.timeline = timeline
        self.result = Measurements()
        self.job_over = threading.Event()
        self._rng = random.Random(args.seed)
        self._thread = threading.Thread(target=self._run, name="disrupter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join(timeout=60)

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
            wait_until("the master's SIGTERM handler", master_handles, self.args.wait_timeout)
        if not self.job_over.is_set():
            log("stopping the job: SIGTERM to the master (this process)")
            os.kill(os.getpid(), signal.SIGTERM)

    def _wait_training(self, expected: set[str]) -> None:
        """Until ``expected`` workers run and each holds a task, then ``--pause`` more."""
        timeout = self.args.wait_timeout

        def training() -> bool:
            running = set(self.probe.running_workers())
            return expected <= running and all(self.probe.holds_task(w) for w in expected)

        wait_until(f"training by {', '.join(sorted(expected))}", training, timeout)
        time.sleep(self.args.pause)

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
            job_name=f"{JOB}-bare",
            namespace=NAMESPACE,
            image=self.options.image,
            owner=None,
        )
        pod_name = pod["metadata"]["name"]
        result = BarePod(pod_name)
        wall, started = time.time(), time.monotonic()
        core.create_namespaced_pod(NAMESPACE, pod)
        timeout = self.args.wait_timeout
        moments = self.timeline.wait(
            f"{pod_name} Running",
            lambda: (m := self.timeline.moments(pod_name)) and m.running and m,
            timeout,
        )
        result.running_s = moments.running - started

        def finished() -> client.V1Pod | None:
            read = core.read_namespaced_pod(pod_name, NAMESPACE)
            if read.status.phase == "Failed":
                raise BenchError(f"{pod_name} failed: {container_log(self.cluster.workdir, read)}")
            return read if read.status.phase == "Succeeded" else None

        done = wait_until(f"{pod_name} to finish", finished, timeout, interval=0.2)
        text = container_log(self.cluster.workdir, done)
        line = next(x for x in reversed(text.splitlines()) if x.startswith('{"imported_at"'))
        result.imported_s = json.loads(line)["imported_at"] - wall
        core.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
        log(
            f"bare pod {number}: Running after {result.running_s:.2f} s, a worker's imports "
            f"done after {result.imported_s:.2f} s"
        )
        return result

    def _delete_one(
        self, core: client.CoreV1Api, number: int, pool: ThreadPoolExecutor | None
    ) -> Deletion:
        """Deletes a running worker's pod and times the recovery; with ``pool``, a bare pod
        is created right after the delete call, to start under the same load as the
        replacement."""
        args, probe, timeline = self.args, self.probe, self.timeline
        victim = self._rng.choice(probe.running_workers())
        pod_name = pods.pod_name(JOB, victim)
        result = Deletion(victim)
        started = time.monotonic()
        core.delete_namespaced_pod(pod_name, NAMESPACE)
        bare = pool.submit(self._bare_pod, number) if pool else None

        def since(at: float | None) -> float | None:
            return None if at is None else round(at - started, 4)

        at, held, reason = probe.wait(
            f"re-queue of {victim}'s tasks", lambda: probe.ended.get(victim), args.wait_timeout
        )
        result.requeue_s, result.tasks_requeued, result.end_reason = since(at), held, reason
        result.master_watch_s = since(probe.backend_ended.get(victim))
        gone = timeline.wait(
            f"DELETED event of {pod_name}",
            lambda: (m := timeline.moments(pod_name)) and m.gone and m,
            args.wait_timeout,
        )
        result.watch_terminating_s = since(gone.terminating)
        result.watch_terminal_s, result.watch_gone_s = since(gone.terminal), since(gone.gone)
        worker_labels = {pods.LABEL_JOB: JOB, pods.LABEL_ROLE: Role.WORKER.value}
        new_pod = timeline.wait(
            f"a replacement of {victim}",
            lambda: timeline.first_added_after(started, worker_labels),
            args.wait_timeout,
        )
        replacement = timeline.moments(new_pod).labels[pods.LABEL_INSTANCE]
        result.replacement = replacement
        running = timeline.wait(
            f"{new_pod} Running",
            lambda: (m := timeline.moments(new_pod)) and m.running and m,
            args.wait_timeout,
        )
        result.replacement_created_s = since(running.added)
        result.replacement_running_s = since(running.running)
        registered = probe.wait(
            f"Register of {replacement}",
            lambda: probe.registered.get(replacement),
            args.wait_timeout,
        )
        result.replacement_registered_s = since(registered)
        log(
            f"deletion {number}/{args.deletions}: {victim} ({held} task(s) re-queued after "
            f"{result.requeue_s:.3f} s; the bench's watch saw it Terminating after "
            f"{result.watch_terminating_s:.3f} s, ended {result.watch_terminal_s:.3f} s, "
            f"DELETED {result.watch_gone_s:.3f} s); "
            f"{replacement} created {result.replacement_created_s:.2f} s, Running "
            f"{result.replacement_running_s:.2f} s, registered "
            f"{result.replacement_registered_s:.2f} s"
        )
        if bare is not None:
            self.result.bare_pods.append(bare.result(timeout=2 * args.wait_timeout))
        survivors = set(probe.running_workers()) - {victim}
        self._wait_training(expected=survivors | {replacement})
        return result


def run_master(args: argparse.Namespace, data_dir: str, options: KubernetesOptions) -> int:
    """``elastic-step train`` of the digits, in this thread (the master handles signals)."""
    from elastic_step.examples import path_of
    from elastic_step.training import train

    output = Path(args.workdir) / "job"
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
        job_name=JOB,
    )
    try:
        return train(config, options)
    except ElasticStepError as e:
        log(f"the job failed: {e}")
        return e.exit_code


def left_over(cluster: Cluster) -> list[str]:
    """Pods of the job still in the namespace, after the master's stop (up to 30 s)."""
    with cluster.admin() as api:
        core = client.CoreV1Api(api)

        def names() -> list[str]:
            items = core.list_namespaced_pod(NAMESPACE, label_selector=pods.job_selector(JOB))
            return [p.metadata.name for p in items.items]

        with contextlib.suppress(BenchError):
            wait_until("no pod of the job", lambda: not names(), 30, interval=0.5)
        return names()


# -- figures --


def stats(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(present), 4),
        "max": round(max(present), 4),
        "n": len(present),
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
        "replacement_created_s": stats([x.replacement_created_s for x in d]),
        "replacement_running_s": stats([x.replacement_running_s for x in d]),
        "replacement_registered_s": stats([x.replacement_registered_s for x in d]),
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
    }
    return {"figures": figures, "ratios_of_medians": ratios, "ratios_per_deletion": per_deletion}


def print_result(summary: dict[str, Any], result: Measurements, bare: str) -> None:
    print()
    print("== recovery from a deleted worker pod (seconds from the delete call) ==")
    header = (
        f"{'#':>2} {'victim':<10}{'tasks':>6}{'master watch':>13}{'re-queue':>10}"
        f"{'bench watch: Term.':>20}{'ended':>7}{'DELETED':>9}  {'replacement':<12}"
        f"{'created':>8}{'Running':>9}{'registered':>12}"
    )
    print(header)

    def f(v: float | None, width: int, digits: int = 3) -> str:
        return f"{'-':>{width}}" if v is None else f"{v:>{width}.{digits}f}"

    for i, x in enumerate(result.deletions, 1):
        print(
            f"{i:>2} {x.victim:<10}{x.tasks_requeued:>6}{f(x.master_watch_s, 13)}"
            f"{f(x.requeue_s, 10)}{f(x.watch_terminating_s, 20)}{f(x.watch_terminal_s, 7)}"
            f"{f(x.watch_gone_s, 9)}  "
            f"{x.replacement or '-':<12}{f(x.replacement_created_s, 8, 2)}"
            f"{f(x.replacement_running_s, 9, 2)}{f(x.replacement_registered_s, 12, 2)}"
        )
    when = "created right after each delete call" if bare == "with" else "alone, before each"
    print(f"bare pods (a worker's imports only; {when}; seconds from the create call):")
    for x in result.bare_pods:
        print(f"   {x.name}: Running {x.running_s:.2f}, imports done {x.imported_s:.2f}")
    print(f"{'':<52}{'median':>8}{'max':>8}")
    labels = {
        "master_watch_s": "    delete -> the master's watch saw the end",
        "requeue_s": "(1) delete -> tasks re-queued by the master",
        "watch_terminating_s": "    delete -> Terminating seen (bench's watch)",
        "watch_terminal_s": "    delete -> container ended seen (bench's watch)",
        "watch_gone_s": "    delete -> DELETED seen (bench's watch)",
        "replacement_running_s": "(2) delete -> replacement Running",
        "replacement_registered_s": "(2) delete -> replacement registered",
        "bare_running_s": "    bare pod: create -> Running",
        "bare_imported_s": "    bare pod: create -> imports done",
    }
    for key, label in labels.items():
        figure = summary["figures"][key]
        if figure["n"]:
            print(f"{label:<52}{figure['median']:>8.3f}{figure['max']:>8.3f}")
    r = summary["ratios_of_medians"]
    print(
        f"ratios of medians: re-queue / container ended seen {r['requeue_over_watch_terminal']}; "
        f"re-queue / DELETED seen {r['requeue_over_watch_gone']}; "
        f"registered / bare imports done {r['registered_over_bare_imported']}; "
        f"replacement Running / bare Running {r['running_over_bare_running']}"
    )
    p = summary["ratios_per_deletion"]
    t, i = p["requeue_over_watch_terminal"], p["registered_over_bare_imported"]
    print(
        f"ratios per deletion (median, max): re-queue / container ended seen {t['median']}, "
        f"{t['max']}; registered / its round's bare imports done {i['median']}, {i['max']}"
    )


# -- main --


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="How fast the Kubernetes backend recovers from a deleted worker pod, on the "
        "test control plane (tests/cluster; needs Go for its first build): delete -> tasks "
        "re-queued, delete -> replacement Running and registered; against Kubernetes' own "
        "deletion latency and a bare pod doing a worker's imports.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        default=str(HERE / "results" / "k8s-recovery"),
        help="scratch directory: the digits, the cluster's files and logs (cluster/), the "
        "job's output (job/), master.log, k8s_recovery.json",
    )
    parser.add_argument("--deletions", type=int, default=5, help="worker pods deleted")
    parser.add_argument(
        "--pause",
        type=float,
        default=5.0,
        help="seconds of training, once every worker holds a task, before each bare pod and "
        "each deletion",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=1000,
        help="the job's epochs: enough to outlast the measurements; the bench stops the job "
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
    parser.add_argument("--worker-cpu", default="500m", help="CPU of worker and bare pods")
    parser.add_argument("--ps-cpu", default="500m", help="CPU of the PS pod")
    parser.add_argument("--seed", type=int, default=7, help="job seed; choice of victims")
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
    log(f"load average {load_1min()} ({os.cpu_count()} CPUs); results in {workdir}")
    data_dir = prepare_data(str(workdir))

    from elastic_step.model.tf_runtime import import_tensorflow_quietly

    import_tensorflow_quietly()  # as the CLI does, before the master imports Keras
    master_log = workdir / "master.log"
    handler = logging.FileHandler(master_log, mode="w")
    handler.setFormatter(
        logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)-7s %(message)s", "%H:%M:%S")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

    cluster_dir = workdir / "cluster"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    cluster_dir.mkdir()
    load_before = load_1min()
    started = time.monotonic()
    busy0, ours0 = machine_busy_s(), own_cpu_s() + children_cpu_s()
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
                disrupter = Disrupter(args, cluster, options, probe, timeline)
                disrupter.start()
                log(
                    f"master of job {JOB} in this process (log: {master_log}); "
                    f"{args.deletions} deletions to come"
                )
                # The master replaces this handler while it runs, and puts it back after.
                signal.signal(signal.SIGTERM, _after_the_master)
                try:
                    exit_code = run_master(args, data_dir, options)
                finally:
                    disrupter.job_over.set()
                    disrupter.join()
                    timeline.stop()
            stopped = " (stopped by the bench, as planned)" if exit_code == 128 + 15 else ""
            log(f"the master exited with status {exit_code}{stopped}")
            leftovers = left_over(cluster)
            if leftovers:
                log(f"pods of the job left after the master's stop: {', '.join(leftovers)}")
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
    result = disrupter.result
    summary = summarize(result)
    document = {
        **run_header(),
        "settings": vars(args),
        "cluster_start_s": round(cluster_s, 2),
        "master_exit_code": exit_code,
        "pods_left_over": leftovers,
        "load_before": load_before,
        "load_after": load_1min(),
        "cpu": cpu,
        "error": result.error,
        "deletions": [asdict(d) for d in result.deletions],
        "bare_pods": [asdict(b) for b in result.bare_pods],
        **summary,
    }
    path = workdir / "k8s_recovery.json"
    write_result(str(path), document)
    print_result(summary, result, args.bare)
    print(
        f"whole run {wall:.0f} s: the bench (cluster, pods, master) used {ours:.0f} CPU-s; "
        f"machine {cpu['machine_busy_cores']:.2f} cores busy, others "
        f"{cpu['other_cores']:.2f}; load {load_before} -> {document['load_after']}"
    )
    if result.error:
        print(f"incomplete: {result.error}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
