"""The life of one worker or PS instance, as an explicit transition table."""

from __future__ import annotations

import enum

from elastic_step.backends.api import EventKind, ExitReason, InstanceEvent


class ProcessState(enum.StrEnum):
    PENDING = "pending"  # asked for, not yet running
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exit status 0
    FAILED = "failed"  # exited with an error: counts toward --max-restarts
    KILLED = "killed"  # killed, deleted or preempted: always replaced

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = {ProcessState.SUCCEEDED, ProcessState.FAILED, ProcessState.KILLED}


class Transition(enum.StrEnum):
    STARTED = "started"
    COMPLETED = "completed"
    ERROR = "error"
    KILLED = "killed"


TRANSITIONS: dict[tuple[ProcessState, Transition], ProcessState] = {
    (ProcessState.PENDING, Transition.STARTED): ProcessState.RUNNING,
    (ProcessState.PENDING, Transition.COMPLETED): ProcessState.SUCCEEDED,
    (ProcessState.PENDING, Transition.ERROR): ProcessState.FAILED,
    (ProcessState.PENDING, Transition.KILLED): ProcessState.KILLED,
    (ProcessState.RUNNING, Transition.STARTED): ProcessState.RUNNING,
    (ProcessState.RUNNING, Transition.COMPLETED): ProcessState.SUCCEEDED,
    (ProcessState.RUNNING, Transition.ERROR): ProcessState.FAILED,
    (ProcessState.RUNNING, Transition.KILLED): ProcessState.KILLED,
}

_BY_REASON = {
    ExitReason.COMPLETED: Transition.COMPLETED,
    ExitReason.ERROR: Transition.ERROR,
    ExitReason.KILLED: Transition.KILLED,
}


def transition_of(event: InstanceEvent) -> Transition:
    if event.kind is EventKind.STARTED:
        return Transition.STARTED
    return _BY_REASON[event.reason or ExitReason.KILLED]


def next_state(state: ProcessState, transition: Transition) -> ProcessState | None:
    """The state after ``transition``; None when the table has no such move (a stale event)."""
    return TRANSITIONS.get((state, transition))
