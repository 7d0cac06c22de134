"""The Backend contract, as tests every backend must pass: ``local`` in ``make test``,
``kubernetes`` in ``make test-k8s``.

A backend's test module subclasses :class:`BackendContract` and provides a ``harness``
fixture (a :class:`BackendHarness`): how to build a backend for one job, and the argv that
runs a piece of Python in an instance.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from elastic_step.backends.api import (
    Backend,
    EventKind,
    ExitReason,
    InstanceEvent,
    LaunchSpec,
    Role,
)

SLEEP = "import time; time.sleep(120)"
IGNORE_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ignoring SIGTERM', flush=True)\n"
    "time.sleep(120)\n"
)


class BackendHarness(ABC):
    #: How long an instance may take to start (a pod is scheduled, then run).
    start_timeout_s: float = 20.0

    @abstractmethod
    def new_backend(self) -> Backend:
        """A backend for the test's job; a second call is a restarted master's."""

    @abstractmethod
    def command(self, code: str) -> list[str]:
        """The argv that runs Python ``code`` in an instance."""


def wait_for(
    backend: Backend, name: str, kind: EventKind, timeout_s: float = 10.0
) -> InstanceEvent:
    """The first ``kind`` event of instance ``name``; the events seen meanwhile are dropped."""
    deadline = time.monotonic() + timeout_s
    seen: list[InstanceEvent] = []
    while time.monotonic() < deadline:
        for event in backend.next_events(0.2):
            if event.name == name and event.kind is kind:
                return event
            seen.append(event)
    raise AssertionError(f"no {kind.value} event for {name} in {timeout_s} s; saw {seen}")


class BackendContract:
    """The semantics of :class:`elastic_step.backends.api.Backend` that the master relies on."""

    def launch(self, harness, backend, name: str, code: str, **kw) -> InstanceEvent:
        role, index = kw.pop("role", Role.WORKER), kw.pop("index", 0)
        backend.launch(LaunchSpec(name, role, index, harness.command(code), **kw))
        return wait_for(backend, name, EventKind.STARTED, harness.start_timeout_s)

    def exited(self, harness, backend, name: str) -> InstanceEvent:
        return wait_for(backend, name, EventKind.EXITED, harness.start_timeout_s + 30)

    def test_exit_status_0_is_completed(self, harness) -> None:
        backend = harness.new_backend()
        self.launch(harness, backend, "worker-0", "pass")
        event = self.exited(harness, backend, "worker-0")
        assert (event.reason, event.exit_code) == (ExitReason.COMPLETED, 0)

    def test_a_non_zero_exit_status_is_a_crash(self, harness) -> None:
        backend = harness.new_backend()
        self.launch(harness, backend, "worker-0", "import sys; sys.exit(3)")
        event = self.exited(harness, backend, "worker-0")
        assert (event.reason, event.exit_code) == (ExitReason.CRASHED, 3)
        assert event.reason.is_fault

    def test_a_signal_nobody_on_the_platform_sent_is_a_crash(self, harness) -> None:
        backend = harness.new_backend()
        self.launch(
            harness, backend, "ps-0", "import os, signal; os.kill(os.getpid(), 9)", role=Role.PS
        )
        event = self.exited(harness, backend, "ps-0")
        assert event.reason is ExitReason.CRASHED
        assert "SIGKILL" in event.message or event.exit_code in (-9, 137), event

    def test_delete_ends_an_instance_as_deleted_not_as_its_fault(self, harness) -> None:
        backend = harness.new_backend()
        self.launch(harness, backend, "worker-0", SLEEP)
        backend.delete("worker-0", grace_period_s=5)
        event = self.exited(harness, backend, "worker-0")
        assert event.reason is ExitReason.DELETED and not event.reason.is_fault
        backend.delete("worker-0")  # gone: a no-op
        backend.delete("no-such-instance")

    def test_delete_kills_an_instance_that_ignores_sigterm_after_the_grace_period(
        self, harness
    ) -> None:
        backend = harness.new_backend()
        self.launch(harness, backend, "worker-0", IGNORE_SIGTERM)
        time.sleep(1)  # let it install its handler
        asked = time.monotonic()
        backend.delete("worker-0", grace_period_s=1)
        event = self.exited(harness, backend, "worker-0")
        assert event.reason is ExitReason.DELETED
        assert time.monotonic() - asked >= 1

    def test_env_and_secret_env_reach_the_instance(self, harness) -> None:
        backend = harness.new_backend()
        code = (
            "import os, sys\n"
            "ok = os.environ.get('ES_PLAIN') == 'a b' and os.environ.get('ES_SECRET') == 's3'\n"
            "sys.exit(0 if ok else 5)\n"
        )
        self.launch(
            harness,
            backend,
            "worker-0",
            code,
            env={"ES_PLAIN": "a b"},
            secret_env={"ES_SECRET": "s3"},
        )
        assert self.exited(harness, backend, "worker-0").exit_code == 0

    def test_launching_a_live_name_again_starts_nothing_new(self, harness) -> None:
        backend = harness.new_backend()
        first = self.launch(harness, backend, "worker-0", SLEEP)
        backend.launch(LaunchSpec("worker-0", Role.WORKER, 0, harness.command(SLEEP)))
        time.sleep(1)
        assert [i.name for i in backend.list_instances()] == ["worker-0"]
        later = [e for e in backend.next_events(0.5) if e.kind is EventKind.STARTED]
        assert all(e.pid in (None, first.pid) for e in later)
        backend.delete("worker-0", grace_period_s=1)
        self.exited(harness, backend, "worker-0")

    def test_a_new_backend_adopts_live_instances_and_reports_their_end(self, harness) -> None:
        old = harness.new_backend()
        self.launch(harness, old, "ps-1", SLEEP, role=Role.PS, index=1)
        self.launch(harness, old, "worker-4", "import time; time.sleep(3)", index=2)
        old.close()  # the old master is gone; its instances run on

        new = harness.new_backend()
        live = {i.name: (i.role, i.index) for i in new.list_instances()}
        assert live == {"ps-1": (Role.PS, 1), "worker-4": (Role.WORKER, 2)}
        ended = self.exited(harness, new, "worker-4")
        assert ended.reason in (ExitReason.COMPLETED, ExitReason.LOST)
        new.delete("ps-1", grace_period_s=1)
        assert self.exited(harness, new, "ps-1").reason is ExitReason.DELETED

    def test_the_master_address(self, harness) -> None:
        backend = harness.new_backend()
        assert backend.listen_host()
        host, port = backend.advertise_master(4321).rsplit(":", 1)
        assert host and port == "4321"
        assert backend.advertise_master(4321) == backend.advertise_master(4321)
