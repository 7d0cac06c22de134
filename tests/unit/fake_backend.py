"""A backend whose instances are entries in a dict, and a clock the test sets: for the unit
tests of the instance manager and the coordinator. It keeps the Backend contract: a launch
is followed by STARTED, an end or a delete by EXITED, each delivered by ``next_events``."""

from __future__ import annotations

from elastic_step.backends.api import (
    Backend,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchRejectedError,
    LaunchSpec,
)


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeBackend(Backend):
    """Keeps its instances in a dict; events wait in a queue until ``next_events``.

    A launch queues STARTED; ``end()`` and ``delete()`` queue EXITED. With ``reject`` > 0 the
    next launches are refused with :class:`LaunchRejectedError`.
    """

    def __init__(self) -> None:
        self.launched: list[LaunchSpec] = []
        self.deleted: list[tuple[str, float]] = []
        self.live: dict[str, InstanceInfo] = {}
        self.events: list[InstanceEvent] = []
        self.reject = 0
        self._next_pid = 1000

    def launch(self, spec: LaunchSpec) -> None:
        if self.reject:
            self.reject -= 1
            raise LaunchRejectedError("exceeded quota: pods=4")
        self.launched.append(spec)
        self._next_pid += 1
        self.live[spec.name] = InstanceInfo(spec.name, spec.role, spec.index, self._next_pid)
        self.events.append(InstanceEvent(spec.name, EventKind.STARTED, pid=self._next_pid))

    def delete(self, name: str, grace_period_s: float = 5.0) -> None:
        if name not in self.live:
            return
        self.deleted.append((name, grace_period_s))
        self.end(name, ExitReason.DELETED, message="deleted")

    def list_instances(self) -> list[InstanceInfo]:
        return list(self.live.values())

    def next_events(self, timeout_s: float) -> list[InstanceEvent]:
        events, self.events = self.events, []
        return events

    def listen_host(self) -> str:
        return "127.0.0.1"

    def advertise_master(self, port: int) -> str:
        return f"127.0.0.1:{port}"

    def close(self) -> None:
        pass

    # -- test controls --

    def end(self, name: str, reason: ExitReason, code: int | None = None, message: str = ""):
        info = self.live.pop(name)
        self.events.append(
            InstanceEvent(name, EventKind.EXITED, code, reason, message, pid=info.pid)
        )

    def names(self) -> list[str]:
        return [spec.name for spec in self.launched]
