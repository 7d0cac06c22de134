"""The relaunch policy: what becomes of a slot when its instance ends, and the counters that
decide it.

- exited with status 0 after the master dismissed it (succeeded): its work is over, the slot
  is retired;
- ended in a slot the sizing policy gave back: the slot stays retired, nothing is counted;
- ended while the job is stopping: nothing is counted, the slot is left to be relaunched on
  resume;
- killed (deleted, preempted, evicted, lost): not its fault, always replaced; the restart is
  counted, but not against ``max_restarts``;
- failed (crashed, OOM-killed, exit 0 before it was dismissed): replaced at most
  ``max_restarts`` times per slot, then given up (what that costs the job is the instance
  manager's call). A slot whose instances keep failing before they finish a task is
  relaunched after an exponential backoff, never in a tight loop.

Slots are named by key (``worker-3``, ``ps-0``). The counters are durable: they go in the
instance manager's snapshot and in its "slot", "restarts" and "restart" journal records. The
backoff deadlines are not. Tests: tests/unit/test_instance_manager.py.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from typing import Protocol

from elastic_step.backends.api import Role
from elastic_step.master.instances.process_state import ProcessState

#: The instance manager's logger: what the policy logs reads as the manager's lines.
log = logging.getLogger("elastic_step.master.instances.instance_manager")

#: Restart events kept (when, which instance, why); past that the oldest are dropped.
MAX_RESTART_EVENTS = 1000


class Verdict(enum.Enum):
    """What becomes of a slot whose instance ended."""

    #: Its work is over: nothing refills the slot.
    RETIRED = "retired"
    #: The job is stopping: the slot is relaunched on resume.
    LEFT = "left"
    #: Relaunched, at once or after a backoff.
    REPLACED = "replaced"
    #: Failed more than ``max_restarts`` times: the slot is not relaunched.
    GIVEN_UP = "given up"


class EndedInstance(Protocol):
    """What the policy reads of an instance that ended."""

    name: str
    role: Role
    slot: int
    state: ProcessState
    #: How it ended: an ExitReason value.
    reason: str

    def describe_end(self) -> str: ...


class RelaunchPolicy:
    """Judges each ended instance's slot, and counts restarts, per slot and in all."""

    def __init__(
        self,
        *,
        max_restarts: int,
        backoff_s: float,
        backoff_max_s: float,
        clock: Callable[[], float],
        elapsed_s: Callable[[], float],
        changed: Callable[[str], None],
    ) -> None:
        """``elapsed_s``: the job's time, which restart events are stamped with.
        ``changed``: called with the journal group of each change ("restarts", "slot:<key>")."""
        self._max_restarts = max_restarts
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._elapsed_s = elapsed_s
        self._changed = changed
        #: Restarts after a failure (the instance's own fault), by slot key.
        self.error_restarts: dict[str, int] = {}
        self.restarts = {Role.WORKER.value: 0, Role.PS.value: 0}
        #: Restarts by how the replaced instance ended (ExitReason values).
        self.restarts_by_reason: dict[str, int] = {}
        #: Each restart: ``{"at_s", "instance", "role", "reason"}``, on the timeline's clock.
        self.restart_events: list[dict] = []
        #: Restart events not journaled yet.
        self.new_events: list[dict] = []
        #: Per slot: failures in a row of instances that finished no task, and when the
        #: slot may be relaunched.
        self.failures_in_a_row: dict[str, int] = {}
        self._relaunch_at: dict[str, float] = {}
        #: Slots whose instance exited with status 0: their work is over, nothing refills them.
        self.retired: set[str] = set()

    def may_launch(self, key: str, now: float) -> bool:
        """Whether slot ``key`` may get a new instance at ``now``: not retired, not backing
        off."""
        return key not in self.retired and self._relaunch_at.get(key, 0.0) <= now

    def judge(self, instance: EndedInstance, key: str, *, stopping: bool) -> Verdict:
        """Decides what becomes of slot ``key``, whose ``instance`` just ended; counts the
        restart, and logs the end."""
        what = instance.describe_end()
        self._changed(f"slot:{key}")
        if instance.state is ProcessState.SUCCEEDED:
            self.retired.add(key)
            log.info("%s", what)
            return Verdict.RETIRED
        if key in self.retired:  # the sizing policy gave the slot back
            log.info("%s; its slot was given back", what)
            return Verdict.RETIRED
        if stopping:
            log.info("%s", what)
            return Verdict.LEFT
        if instance.state is ProcessState.KILLED:
            self._count_restart(instance)
            log.warning("%s; replacing it (not its fault: does not count)", what)
            return Verdict.REPLACED
        used = self.error_restarts.get(key, 0)
        if used >= self._max_restarts:
            return Verdict.GIVEN_UP
        self.error_restarts[key] = used + 1
        self._count_restart(instance)
        delay = self._back_off(key)
        log.warning(
            "%s; replacing it%s (restart %d of --max-restarts=%d for %s slot %d)",
            what,
            f" in {delay:.0f} s, as it finished no task" if delay else "",
            used + 1,
            self._max_restarts,
            instance.role.value,
            instance.slot,
        )
        return Verdict.REPLACED

    def note_task_done(self, key: str) -> bool:
        """An instance of slot ``key`` finished a task: the slot is healthy, so its failure
        backoff resets. Says whether that changed anything."""
        if key not in self.failures_in_a_row:
            return False
        del self.failures_in_a_row[key]
        self._changed(f"slot:{key}")
        return True

    # -- persistence: the instance manager's snapshot and journal --

    def snapshot(self) -> dict:
        return {
            "error_restarts": dict(self.error_restarts),
            "restarts": dict(self.restarts),
            "restarts_by_reason": dict(self.restarts_by_reason),
            "restart_events": [dict(event) for event in self.restart_events],
            "failures_in_a_row": dict(self.failures_in_a_row),
            "retired": sorted(self.retired),
        }

    def restore(self, state: dict) -> None:
        self.error_restarts = dict(state["error_restarts"])
        self.restarts = dict(state["restarts"])
        self.restarts_by_reason = dict(state["restarts_by_reason"])
        # Absent from the state of versions that did not record when restarts happened.
        self.restart_events = [dict(event) for event in state.get("restart_events", [])]
        self.failures_in_a_row = dict(state["failures_in_a_row"])
        self.retired = set(state["retired"])

    def slot_record(self, key: str) -> dict:
        return {
            "op": "slot",
            "key": key,
            "error_restarts": self.error_restarts.get(key),
            "failures_in_a_row": self.failures_in_a_row.get(key),
            "retired": key in self.retired,
        }

    def counts_record(self) -> dict:
        return {
            "op": "restarts",
            "restarts": dict(self.restarts),
            "restarts_by_reason": dict(self.restarts_by_reason),
        }

    def apply(self, record: dict) -> None:
        """Replays a "slot", "restarts" or "restart" record."""
        match record["op"]:
            case "slot":
                key = record["key"]
                for field, values in (
                    ("error_restarts", self.error_restarts),
                    ("failures_in_a_row", self.failures_in_a_row),
                ):
                    if record[field] is None:
                        values.pop(key, None)
                    else:
                        values[key] = record[field]
                if record["retired"]:
                    self.retired.add(key)
                else:
                    self.retired.discard(key)
            case "restarts":
                self.restarts = dict(record["restarts"])
                self.restarts_by_reason = dict(record["restarts_by_reason"])
            case "restart":
                self._add_restart_event(record["event"])
            case op:
                raise ValueError(f"unknown instance record kind {op!r}")

    # -- internals --

    def _count_restart(self, instance: EndedInstance) -> None:
        self._changed("restarts")
        # A standby's key appears with its first restart: most jobs run without.
        self.restarts[instance.role.value] = self.restarts.get(instance.role.value, 0) + 1
        self.restarts_by_reason[instance.reason] = (
            self.restarts_by_reason.get(instance.reason, 0) + 1
        )
        event = {
            "at_s": self._elapsed_s(),
            "instance": instance.name,
            "role": instance.role.value,
            "reason": instance.reason,
        }
        self._add_restart_event(event)
        self.new_events.append(event)

    def _add_restart_event(self, event: dict) -> None:
        self.restart_events.append(dict(event))
        if len(self.restart_events) > MAX_RESTART_EVENTS:
            del self.restart_events[0]

    def _back_off(self, key: str) -> float:
        """The delay before relaunching a slot after a failure; 0 after its first one.

        A worker that finished a task resets its slot's count (:meth:`note_task_done`); a PS
        never does, so a PS that keeps failing also backs off.
        """
        failures = self.failures_in_a_row.get(key, 0) + 1
        self.failures_in_a_row[key] = failures
        if failures < 2:
            return 0.0
        delay = min(self._backoff_s * 2 ** (failures - 2), self._backoff_max_s)
        self._relaunch_at[key] = self._clock() + delay
        return delay
