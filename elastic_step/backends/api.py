"""The interface through which the master starts, stops and watches its processes.

A backend runs *instances*: one worker or parameter server each, named uniquely by the master
(``worker-3``, ``ps-0-r1``). The master never touches a process or a pod itself; it calls
:meth:`Backend.launch` and :meth:`Backend.delete` and reads what happened from
:meth:`Backend.next_events`. The ``local`` backend runs instances as subprocesses; the
``kubernetes`` backend runs them as pods. Both fit this interface unchanged.
Tests: tests/contracts/backend_contract.py, run for each backend by
tests/unit/test_local_backend_contract.py and tests/k8s/test_k8s_backend_contract.py.
"""

from __future__ import annotations

import enum
import queue
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from elastic_step.errors import ElasticStepError


class BackendError(ElasticStepError):
    """A backend could not do what was asked (the message says what and why)."""


class LaunchRejectedError(BackendError):
    """The platform refused an instance for now (no capacity, quota); the master may retry later."""


class Role(enum.StrEnum):
    WORKER = "worker"
    PS = "ps"
    #: A worker process kept started, TensorFlow loaded, to take a dead worker's slot at once.
    #: A backend starts it as a worker (the same command and resources).
    STANDBY = "standby"


class EventKind(enum.StrEnum):
    #: The instance exists but does not run yet (a pod waiting for a node or an image);
    #: ``message`` says why. It uses no restart and blocks nothing.
    PENDING = "pending"
    #: The instance runs (a process exists, a pod is Running).
    STARTED = "started"
    #: The instance is gone; ``reason`` says how it ended.
    EXITED = "exited"


class ExitReason(enum.StrEnum):
    """How an instance ended. Only the program's own faults count against it."""

    #: Exit status 0.
    COMPLETED = "completed"
    #: A non-zero exit status, or a signal that neither the master nor the platform sent.
    CRASHED = "crashed"
    #: Killed for using more memory than its limit.
    OOM_KILLED = "oom-killed"
    #: Deleted by the master.
    DELETED = "deleted"
    #: Taken by the platform for higher-priority work.
    PREEMPTED = "preempted"
    #: Evicted by the platform (node pressure, drain).
    EVICTED = "evicted"
    #: Gone, and how is unknown (an adopted process, a lost node).
    LOST = "lost"

    @property
    def is_fault(self) -> bool:
        """True when the program itself ended it: counts toward --max-restarts and the
        failures of the tasks it held."""
        return self in (ExitReason.CRASHED, ExitReason.OOM_KILLED)


class StopKind(enum.StrEnum):
    """What the platform asks of the master when it stops it."""

    #: The run is stopped (cancelled, terminated, its master pod deleted by a person): the
    #: master removes its instances and keeps the job's state, so the same command resumes.
    STOP = "stop"
    #: The master itself moves (evicted, preempted, its pod lost under an engine that
    #: retries the step): it leaves its instances running for the next master to adopt.
    HANDOVER = "handover"


@dataclass(frozen=True)
class StopRequest:
    kind: StopKind
    #: What the platform showed, in one line ("Workflow wf-1: spec.shutdown is Stop").
    reason: str


@dataclass(frozen=True)
class Resources:
    """What one instance asks the platform for; the local backend ignores it."""

    cpu: str | None = None
    memory: str | None = None
    gpu: int = 0
    priority_class: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    """One instance to start."""

    name: str
    role: Role
    #: Worker slot, or PS shard index.
    index: int
    #: The argv of the process; ``command[0]`` is resolved on the instance's PATH.
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: Environment variables whose values are secret (the job's credentials). A backend
    #: never writes them where others can read them: the local backend puts them in the
    #: process's environment only; a cluster backend keeps them in a Secret that the
    #: instance's environment refers to, never in its spec.
    secret_env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    #: Modules the program imports before it does anything else. A backend may import them
    #: once and share them between instances: the local backend forks a ``python -m``
    #: command that has some from a process that imported them (``fork_server.py``).
    preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class InstanceInfo:
    """A live instance, as the platform reports it."""

    name: str
    role: Role
    index: int
    #: Process id for the local backend; None where the platform has none to give.
    pid: int | None = None


@dataclass(frozen=True)
class InstanceEvent:
    name: str
    kind: EventKind
    exit_code: int | None = None
    reason: ExitReason | None = None
    #: A human-readable detail: the signal, the pod's reason.
    message: str = ""
    pid: int | None = None


@dataclass(frozen=True, kw_only=True)
class JobOwner:
    """The object of the platform that stands for the run (an Argo Workflow, a batch Job, a
    ConfigMap the backend made): what owns the job's objects, by its API identity."""

    api_version: str
    kind: str
    name: str
    uid: str


def take_events(events: queue.Queue[InstanceEvent], timeout_s: float) -> list[InstanceEvent]:
    """Every event queued now, waiting up to ``timeout_s`` for the first: how a backend whose
    watcher queues events answers :meth:`Backend.next_events`."""
    taken = []
    try:
        taken.append(events.get(timeout=timeout_s))
        while True:
            taken.append(events.get_nowait())
    except queue.Empty:
        pass
    return taken


class Backend(ABC):
    """Starts, stops and watches the instances of one job.

    Implementations are thread-safe: the master calls them from its main loop and its gRPC
    handlers.
    """

    @abstractmethod
    def launch(self, spec: LaunchSpec) -> None:
        """Starts an instance. Its STARTED event follows once it runs, then EXITED when it ends.

        Idempotent: launching a name that is live starts nothing. Must not block on slow
        platform calls for long: the master calls it under its lock.

        Raises :class:`LaunchRejectedError` when the platform refuses it for now and
        :class:`BackendError` for anything else.
        """

    @abstractmethod
    def delete(self, name: str, grace_period_s: float = 5.0) -> None:
        """Asks an instance to stop (SIGTERM), and kills it after ``grace_period_s``.

        Returns at once; its EXITED event follows. Deleting an unknown name is a no-op.
        """

    @abstractmethod
    def list_instances(self) -> list[InstanceInfo]:
        """The job's live instances, including those an earlier master started.

        Listing adopts them: from then on their exits arrive as events too.
        """

    @abstractmethod
    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        """Events since the last call, waiting up to ``timeout_s`` for the first one."""

    @abstractmethod
    def listen_host(self) -> str:
        """The address the master's server binds: only where its instances reach it
        (loopback for local processes, the pod's own IP on Kubernetes)."""

    @abstractmethod
    def advertise_master(self, port: int) -> str:
        """The ``host:port`` that instances are given to reach the master on ``port``.

        It stays valid when the master is restarted elsewhere (on Kubernetes: a headless
        Service that selects the current master pod, created or updated here), so that
        instances that outlive a master find the next one. Idempotent.
        """

    def stop_request(self, signalled: bool = False) -> StopRequest | None:
        """What the platform asks of the master, read from its API: no signal is needed.

        The master polls it every tick, so it answers at once from what a watcher has seen;
        None while the run goes on. With ``signalled`` (the master got SIGTERM) it reads
        the platform now, so that the signal is told apart: a move of the master (a
        HANDOVER) or a stop of the run. A SIGTERM that the platform does not explain is
        answered with None, and the master takes it for a STOP.
        """
        return None

    def owner(self) -> JobOwner | None:
        """The platform's object that the job's other objects (its state on a cluster) should
        be owned by, so that deleting the run removes them too; None where nothing owns
        them."""
        return None

    def remove_job_objects(self) -> None:  # noqa: B027 - most backends make nothing else
        """Removes what the backend made for the job's instances besides them (a Service,
        their credentials). Called once the job is over or stopped. Whatever owns the job's
        state (an owner object) stays: only deleting the run, or that owner, forgets the job.
        """

    @abstractmethod
    def close(self) -> None:
        """Stops watching. Instances keep running; delete them first to end them."""
