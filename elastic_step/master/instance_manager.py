"""Keeps the job's workers and parameter servers running, through a :class:`Backend`.

Membership is a set of *slots*: one per PS shard and one per wanted worker. Each slot has at
most one live instance; when it ends, the relaunch policy decides:

- killed, deleted or preempted: always replaced;
- exited with an error: replaced at most ``max_restarts`` times per slot, then the slot is
  given up. A given-up PS shard fails the job; so does having fewer than ``min_workers``
  worker slots left;
- exited with status 0: not replaced (workers exit 0 only when the job is over).

The job starts with ``workers`` worker slots and grows by one, up to ``max_workers``, each time
every wanted worker has been running for ``grow_after_s`` seconds: a cluster that grants the
pods lets the job grow.

Not thread-safe; the master serializes calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from elastic_step.backends.api import (
    Backend,
    InstanceEvent,
    InstanceInfo,
    LaunchRejectedError,
    LaunchSpec,
    Role,
)
from elastic_step.master.process_state import ProcessState, next_state, transition_of

log = logging.getLogger(__name__)


@dataclass
class Instance:
    name: str
    role: Role
    #: The slot: worker slot number, or PS shard index.
    slot: int
    state: ProcessState = ProcessState.PENDING
    pid: int | None = None
    exit_code: int | None = None
    message: str = ""

    def to_json(self) -> dict:
        return {**asdict(self), "role": self.role.value, "state": self.state.value}

    @classmethod
    def from_json(cls, d: dict) -> Instance:
        return cls(**{**d, "role": Role(d["role"]), "state": ProcessState(d["state"])})


@dataclass(frozen=True)
class MembershipSettings:
    workers: int
    min_workers: int
    max_workers: int
    num_ps: int
    max_restarts: int
    grow_after_s: float = 10.0


SpecFactory = Callable[[Role, int, str], LaunchSpec]


class InstanceManager:
    def __init__(
        self,
        backend: Backend,
        settings: MembershipSettings,
        spec_for: SpecFactory,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self.settings = settings
        self._spec_for = spec_for
        self._clock = clock
        self.instances: dict[str, Instance] = {}
        self.worker_slots: set[int] = set(range(settings.workers))
        self.error_restarts: dict[str, int] = {}
        self.restarts = {Role.WORKER.value: 0, Role.PS.value: 0}
        #: Slots whose instance exited with status 0: their work is over, nothing refills them.
        self.retired: set[str] = set()
        self.started_at = clock()
        self.timeline: list[list[float]] = [[0.0, 0]]
        self._last_change = clock()
        self._retry_launch_at = 0.0
        self.stopping = False
        #: Set when the membership can no longer run the job.
        self.failure: str | None = None

    # -- membership --

    def live(self, role: Role) -> list[Instance]:
        return [i for i in self.instances.values() if i.role is role and not i.state.ended]

    def running_workers(self) -> int:
        return sum(1 for i in self.live(Role.WORKER) if i.state is ProcessState.RUNNING)

    def reconcile(self) -> None:
        """Launches an instance for every slot that lacks one, and grows the job when it may."""
        if self.stopping or self.failure or self._clock() < self._retry_launch_at:
            return
        self._maybe_grow()
        wanted = [(Role.PS, shard) for shard in range(self.settings.num_ps)]
        wanted += [(Role.WORKER, slot) for slot in sorted(self.worker_slots)]
        occupied = {(i.role, i.slot) for i in self.instances.values() if not i.state.ended}
        for role, slot in wanted:
            if (role, slot) in occupied or self._slot_key(role, slot) in self.retired:
                continue
            try:
                self._launch(role, slot)
            except LaunchRejectedError as e:
                log.info("cannot start a %s now (%s); will retry in 5 s", role.value, e)
                self._retry_launch_at = self._clock() + 5.0
                return

    def handle(self, event: InstanceEvent) -> Instance | None:
        """Applies a backend event; returns the instance if it just ended."""
        instance = self.instances.get(event.name)
        if instance is None:
            return None
        new_state = next_state(instance.state, transition_of(event))
        if new_state is None:
            return None
        instance.state = new_state
        instance.pid = event.pid or instance.pid
        if not new_state.ended:
            self._note_membership_change()
            return None
        instance.exit_code = event.exit_code
        instance.message = event.message
        self._note_membership_change()
        self._apply_relaunch_policy(instance)
        return instance

    def adopt(self, live: list[InstanceInfo]) -> list[Instance]:
        """After a master restart: keeps the recorded instances that still run.

        Returns the recorded instances that were lost while the master was away. A live
        instance the record lacks (the master died between launching and saving) is adopted
        into its slot, or deleted if the slot is taken.
        """
        live_by_name = {info.name: info for info in live}
        lost = []
        for instance in self.instances.values():
            if instance.state.ended:
                continue
            info = live_by_name.pop(instance.name, None)
            if info is None:
                instance.state = ProcessState.KILLED
                instance.message = "lost while the master was away"
                lost.append(instance)
                self._apply_relaunch_policy(instance)
            else:
                instance.state = ProcessState.RUNNING
                instance.pid = info.pid
        occupied = {(i.role, i.slot) for i in self.instances.values() if not i.state.ended}
        for info in live_by_name.values():
            if (info.role, info.index) in occupied:
                log.info("deleting %s: its slot already has an instance", info.name)
                self._backend.delete(info.name, grace_period_s=0)
                # Kept on record as ended, so that its name is not given out again.
                self.instances[info.name] = Instance(
                    info.name,
                    info.role,
                    info.index,
                    ProcessState.KILLED,
                    info.pid,
                    message="deleted: its slot already had an instance",
                )
                continue
            self.instances[info.name] = Instance(
                info.name, info.role, info.index, ProcessState.RUNNING, info.pid
            )
            occupied.add((info.role, info.index))
        self._note_membership_change()
        return lost

    def delete_all(self, grace_period_s: float) -> None:
        """Stops every live instance; nothing is relaunched afterwards."""
        self.stopping = True
        for instance in list(self.instances.values()):
            if not instance.state.ended:
                self._backend.delete(instance.name, grace_period_s=grace_period_s)

    # -- persistence --

    def to_state(self) -> dict:
        return {
            "instances": [i.to_json() for i in self.instances.values()],
            "worker_slots": sorted(self.worker_slots),
            "error_restarts": self.error_restarts,
            "restarts": self.restarts,
            "retired": sorted(self.retired),
            "started_at": self.started_at,
            "timeline": self.timeline,
            "failure": self.failure,
        }

    def restore(self, state: dict) -> None:
        self.instances = {d["name"]: Instance.from_json(d) for d in state["instances"]}
        self.worker_slots = set(state["worker_slots"])
        self.error_restarts = dict(state["error_restarts"])
        self.restarts = dict(state["restarts"])
        self.retired = set(state["retired"])
        self.started_at = state["started_at"]
        self.timeline = [list(point) for point in state["timeline"]]
        self.failure = state["failure"]

    # -- internals --

    @staticmethod
    def _slot_key(role: Role, slot: int) -> str:
        return f"{role.value}-{slot}"

    def _launch(self, role: Role, slot: int) -> None:
        name = self._next_name(role, slot)
        spec = self._spec_for(role, slot, name)
        self._backend.launch(spec)
        self.instances[name] = Instance(name, role, slot)
        log.info("launched %s (%s slot %d)", name, role.value, slot)

    def _next_name(self, role: Role, slot: int) -> str:
        """A name no instance of this job ever had, adopted ones included.

        Names are never reused, so a report or an event from a dead instance is never taken
        for its successor's.
        """
        if role is Role.WORKER:
            numbers = [
                int(name.rsplit("-", 1)[1]) for name in self.instances if name.startswith("worker-")
            ]
            return f"worker-{max(numbers, default=-1) + 1}"
        prefix = f"ps-{slot}"
        suffixes = [
            0 if name == prefix else int(name[len(prefix) + 1 :])
            for name in self.instances
            if name == prefix or name.startswith(f"{prefix}-")
        ]
        return prefix if not suffixes else f"{prefix}-{max(suffixes) + 1}"

    def _apply_relaunch_policy(self, instance: Instance) -> None:
        role, key = instance.role, self._slot_key(instance.role, instance.slot)
        what = f"{instance.name} {instance.state.value} ({instance.message or 'no detail'})"
        if instance.state is ProcessState.SUCCEEDED:
            self.retired.add(key)
            log.info("%s", what)
            return
        if self.stopping:
            log.info("%s", what)
            return
        if instance.state is ProcessState.KILLED:
            self.restarts[role.value] += 1
            log.warning("%s; replacing it (killed processes are always replaced)", what)
            return
        used = self.error_restarts.get(key, 0)
        if used < self.settings.max_restarts:
            self.error_restarts[key] = used + 1
            self.restarts[role.value] += 1
            log.warning(
                "%s; replacing it (restart %d of --max-restarts=%d for %s slot %d)",
                what,
                used + 1,
                self.settings.max_restarts,
                role.value,
                instance.slot,
            )
            return
        if role is Role.PS:
            self.failure = (
                f"parameter server shard {instance.slot} failed more than "
                f"--max-restarts={self.settings.max_restarts} times; last: {what}"
            )
        else:
            self.worker_slots.discard(instance.slot)
            log.error("%s; giving up worker slot %d after %d restarts", what, instance.slot, used)
            if len(self.worker_slots) < self.settings.min_workers:
                self.failure = (
                    f"only {len(self.worker_slots)} worker slots are left, fewer than "
                    f"--min-workers={self.settings.min_workers}; last: {what}"
                )

    def _maybe_grow(self) -> None:
        if len(self.worker_slots) >= self.settings.max_workers:
            return
        if self.running_workers() < len(self.worker_slots):
            return
        if self._clock() - self._last_change < self.settings.grow_after_s:
            return
        slot = max(self.worker_slots, default=-1) + 1
        self.worker_slots.add(slot)
        log.info(
            "all %d workers are running; growing to %d (--max-workers=%d)",
            len(self.worker_slots) - 1,
            len(self.worker_slots),
            self.settings.max_workers,
        )

    def _note_membership_change(self) -> None:
        self._last_change = self._clock()
        running = self.running_workers()
        if self.timeline[-1][1] != running:
            self.timeline.append([round(self._clock() - self.started_at, 3), running])
