"""The life of one worker or PS instance, as an explicit transition table.
Tests: tests/unit/test_instance_manager.py (test_transition_table, test_transition_of_events)."""

from __future__ import annotations

import enum

from elastic_step.backends.api import EventKind, ExitReason, InstanceEvent


class ProcessState(enum.StrEnum):
    PENDING = "pending"  # asked for, not yet running
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exit status 0 once the job is over
    FAILED = "failed"  # crashed or OOM-killed: counts toward --max-restarts and task failures
    KILLED = "killed"  # deleted, preempted, evicted or lost: not its fault, always replaced

    @property
    def ended(self) -> bool:
        return self in _ENDED


_ENDED = {ProcessState.SUCCEEDED, ProcessState.FAILED, ProcessState.KILLED}


class Transition(enum.StrEnum):
    WAITING = "waiting"  # still pending, for a reason the platform gives
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"


TRANSITIONS: dict[tuple[ProcessState, Transition], ProcessState] = {
    (ProcessState.PENDING, Transition.WAITING): ProcessState.PENDING,
    (ProcessState.PENDING, Transition.STARTED): ProcessState.RUNNING,
    (ProcessState.PENDING, Transition.COMPLETED): ProcessState.SUCCEEDED,
    (ProcessState.PENDING, Transition.FAILED): ProcessState.FAILED,
    (ProcessState.PENDING, Transition.KILLED): ProcessState.KILLED,
    (ProcessState.RUNNING, Transition.STARTED): ProcessState.RUNNING,
    (ProcessState.RUNNING, Transition.COMPLETED): ProcessState.SUCCEEDED,
    (ProcessState.RUNNING, Transition.FAILED): ProcessState.FAILED,
    (ProcessState.RUNNING, Transition.KILLED): ProcessState.KILLED,
}


def transition_of(event: InstanceEvent) -> Transition:
    if event.kind is EventKind.PENDING:
        return Transition.WAITING
    if event.kind is EventKind.STARTED:
        return Transition.STARTED
    reason = event.reason or ExitReason.LOST
    if reason is ExitReason.COMPLETED:
        return Transition.COMPLETED
    return Transition.FAILED if reason.is_fault else Transition.KILLED


def next_state(state: ProcessState, transition: Transition) -> ProcessState | None:
    """The state after ``transition``; None when the table has no such move (a stale event)."""
    return TRANSITIONS.get((state, transition))
