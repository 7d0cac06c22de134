"""Keeps the job's workers and parameter servers running, through a :class:`Backend`.

Membership is a set of *slots*: one per PS shard and one per wanted worker. Each slot has at
most one live instance; when it ends, the relaunch policy decides
(:mod:`~elastic_step.master.instances.relaunch_policy`, which also keeps the restart counters):

- deleted, preempted, evicted or lost: not its fault, always replaced;
- crashed or OOM-killed (its own fault): replaced at most ``max_restarts`` times per slot,
  then the slot is given up. A given-up PS shard fails the job; so does having fewer than
  ``min_workers`` worker slots left. A slot whose instances keep failing before they finish
  a task is relaunched after an exponential backoff, never in a tight loop;
- exited with status 0 after the master dismissed it (:meth:`dismiss`): its work is over,
  the slot is retired. Exit 0 before that is a crash (user code that calls ``sys.exit(0)``
  must not end the job's workers one by one). While the job is stopping nothing is
  retired: a stop must leave every slot to be relaunched on resume.

The job starts with ``workers`` worker slots; its sizing policy
(:mod:`~elastic_step.master.worker_sizing`) adds or gives back one at a time, within
``max_workers``. By default it grows by one each time every wanted worker has been running for
``grow_after_s`` seconds (a cluster that grants the pods lets the job grow); with
``--auto-workers`` it grows while an added worker raises examples/s enough. A slot given back
is retired: a worker pending there is deleted, a running one finishes its task and is told
that the job is over for it.

Standbys (``standby`` > 0): that many extra worker processes, in slots of their own, that start
and load TensorFlow and the model but train nothing. When a worker slot needs an instance and
a standby has loaded everything and waits (:meth:`note_standby_ready`), it is promoted into
the slot instead of a new launch (its name stays); its own slot is then refilled by a new
standby.
A crashing standby slot is given up after ``max_restarts``, which costs speed, never the job.

Not thread-safe; the master serializes calls. Tests: tests/unit/test_instance_manager.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from elastic_step.backends.api import (
    Backend,
    BackendError,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchRejectedError,
    Role,
)
from elastic_step.master.instances.api import Instance, MembershipSettings, SpecFactory
from elastic_step.master.instances.instance_names import InstanceNames
from elastic_step.master.instances.process_state import (
    ProcessState,
    Transition,
    next_state,
    transition_of,
)
from elastic_step.master.instances.relaunch_policy import RelaunchPolicy, Verdict
from elastic_step.master.instances.sizing_ledger import SizingLedger
from elastic_step.master.worker_sizing import (
    SizingAction,
)

log = logging.getLogger(__name__)

#: Launch errors in a row (other than "no capacity now") after which the job fails.
MAX_LAUNCH_ERRORS = 8
#: Ended instances kept on record (for status and summary); older ones are forgotten, so
#: the state stays small however many restarts a long job sees. Names are never reused.
KEEP_ENDED = 100
#: Points kept in the workers timeline; past that the oldest (but the first) are dropped.
MAX_TIMELINE = 1000
#: Launches per reconcile: the master launches under its lock, so a job of 1,000 workers
#: starts over a few seconds of ticks instead of holding every RPC for one long pass.
MAX_LAUNCHES_PER_RECONCILE = 32


class InstanceManager:
    def __init__(
        self,
        backend: Backend,
        settings: MembershipSettings,
        spec_for: SpecFactory,
        clock: Callable[[], float] = time.time,
        journal: Callable[[dict], None] | None = None,
    ) -> None:
        self._backend = backend
        #: Called with a small record for every change worth keeping across a master restart.
        self._journal = journal or (lambda record: None)
        #: What changed since the last journal records: groups, and new timeline points.
        self._changed: set[str] = set()
        self._new_points: list[list[float]] = []
        self.names = InstanceNames()
        #: Standbys moved into worker slots, over the job's life.
        self.promotions = 0
        self.settings = settings
        self._spec_for = spec_for
        self._clock = clock
        self.instances: dict[str, Instance] = {}
        self.worker_slots: set[int] = set(range(settings.workers))
        self.sizing = SizingLedger(settings.sizing_policy(), clock)
        #: Standbys loaded and waiting, oldest first (not durable: a waiting standby
        #: registers again with a restarted master).
        self._ready_standbys: dict[str, None] = {}
        self.relaunch = RelaunchPolicy(
            max_restarts=settings.max_restarts,
            backoff_s=settings.backoff_s,
            backoff_max_s=settings.backoff_max_s,
            clock=clock,
            elapsed_s=self.elapsed_s,
            changed=self._changed.add,
        )
        self.started_at = clock()
        self.timeline: list[list[float]] = [[0.0, 0]]
        self._last_change = clock()
        self._retry_launch_at = 0.0
        self._launch_errors = 0
        self._starving_since: float | None = None
        #: Instances told that the job is over (not journaled: once the job is over, or
        #: their slot given back, a restarted master tells them again at their next call).
        self.dismissed: set[str] = set()
        self.stopping = False
        #: Set when the membership can no longer run the job.
        self.failure: str | None = None

    @property
    def restarts(self) -> dict[str, int]:
        """Restarts by role."""
        return self.relaunch.restarts

    @property
    def restarts_by_reason(self) -> dict[str, int]:
        return self.relaunch.restarts_by_reason

    @property
    def restart_events(self) -> list[dict]:
        return self.relaunch.restart_events

    # -- membership --

    def live(self, role: Role) -> list[Instance]:
        return [i for i in self.instances.values() if i.role is role and not i.state.ended]

    def running_workers(self) -> int:
        return sum(1 for i in self.live(Role.WORKER) if i.state is ProcessState.RUNNING)

    def reconcile(self) -> None:
        """Launches an instance for every slot that lacks one, and grows the job when it may."""
        if self.stopping or self.failure:
            return
        self._check_starving()
        if self.failure or self._clock() < self._retry_launch_at:
            return
        self._resize()
        wanted = [(Role.PS, shard) for shard in range(self.settings.num_ps)]
        wanted += [(Role.WORKER, slot) for slot in sorted(self.worker_slots)]
        wanted += [(Role.STANDBY, slot) for slot in range(self.settings.standby)]
        occupied = {(i.role, i.slot) for i in self.instances.values() if not i.state.ended}
        now = self._clock()
        launches = 0
        for role, slot in wanted:
            if launches == MAX_LAUNCHES_PER_RECONCILE:
                return
            key = self._slot_key(role, slot)
            if (role, slot) in occupied or not self.relaunch.may_launch(key, now):
                continue
            if role is Role.WORKER and self._promote_standby(slot):
                continue
            try:
                self._launch(role, slot)
            except LaunchRejectedError as e:
                log.info("cannot start a %s now (%s); will retry in 5 s", role.value, e)
                self._retry_launch_at = self._clock() + 5.0
                return
            except BackendError as e:
                self._launch_errors += 1
                if self._launch_errors > MAX_LAUNCH_ERRORS:
                    self.failure = (
                        f"cannot start a {role.value}: {e} "
                        f"({self._launch_errors} launch errors in a row)"
                    )
                    self._changed.add("failure")
                    self._record()
                    return
                delay = min(2.0**self._launch_errors, self.settings.backoff_max_s)
                log.error("cannot start a %s: %s; will retry in %.0f s", role.value, e, delay)
                self._retry_launch_at = self._clock() + delay
                return
            self._launch_errors = 0
            launches += 1

    def handle(self, event: InstanceEvent) -> Instance | None:
        """Applies a backend event; returns the instance if it just ended."""
        instance = self.instances.get(event.name)
        if instance is None:
            return None
        transition = transition_of(event)
        reason = event.reason or ExitReason.LOST
        message = event.message
        if transition is Transition.COMPLETED and self.stopping:
            # Whatever made it exit 0 during a stop, its work is not over: on resume the
            # slot must be relaunched, so it is not recorded as succeeded.
            transition = Transition.KILLED
        elif transition is Transition.COMPLETED and event.name not in self.dismissed:
            transition, reason = Transition.FAILED, ExitReason.CRASHED
            message = f"{message}, before the master dismissed it"
        elif (
            reason is ExitReason.LOST
            and event.exit_code is None
            and event.name in self.dismissed
            and not self.stopping
        ):
            # An adopted process's exit status went to init, not to this master; exiting
            # once dismissed is what it was told to do.
            transition, reason = Transition.COMPLETED, ExitReason.COMPLETED
            message = f"{message}, after the master dismissed it"
        new_state = next_state(instance.state, transition)
        if new_state is None:
            return None
        instance.state = new_state
        if instance.role is Role.WORKER:
            if new_state is ProcessState.RUNNING:
                self.sizing.note_running(instance.slot)
            elif new_state.ended and instance.slot in self.worker_slots:
                self.sizing.note_waiting(instance.slot)
        instance.pid = event.pid or instance.pid
        if transition is Transition.WAITING:
            if instance.message != event.message:
                instance.message = event.message
                log.info("%s is pending: %s", instance.name, event.message or "no reason given")
                self._record(instance)
            return None
        if not new_state.ended:
            instance.message = ""
            self._note_membership_change()
            self._record(instance)
            return None
        instance.exit_code = event.exit_code
        instance.reason = reason.value
        instance.message = message
        self._note_membership_change()
        self._apply_relaunch_policy(instance)
        self._record(instance)
        return instance

    def adopt(self, live: list[InstanceInfo]) -> list[Instance]:
        """After a master restart: keeps the recorded instances that still run.

        Returns the recorded instances that were lost while the master was away. A live
        instance the record lacks (the master died between launching and saving) is adopted
        into its slot, or deleted if the slot is taken.
        """
        live_by_name = {info.name: info for info in live}
        lost, kept = [], []
        for instance in list(self.instances.values()):
            if instance.state.ended:
                continue
            info = live_by_name.pop(instance.name, None)
            if info is None:
                instance.state = ProcessState.KILLED
                instance.reason = ExitReason.LOST.value
                instance.message = "lost while the master was away"
                lost.append(instance)
                self._apply_relaunch_policy(instance)
            else:
                instance.state = ProcessState.RUNNING
                instance.pid = info.pid
                kept.append(instance)
        occupied = {(i.role, i.slot) for i in kept}
        for info in live_by_name.values():
            if (info.role, info.index) in occupied:
                log.info("deleting %s: its slot already has an instance", info.name)
                self._backend.delete(info.name, grace_period_s=0)
                # Kept on record as ended, so that its name is not given out again.
                self._record(
                    Instance(
                        info.name,
                        info.role,
                        info.index,
                        ProcessState.KILLED,
                        info.pid,
                        reason=ExitReason.DELETED.value,
                        message="its slot already had an instance",
                    )
                )
                continue
            self._record(Instance(info.name, info.role, info.index, ProcessState.RUNNING, info.pid))
            occupied.add((info.role, info.index))
        for instance in kept + lost:
            self._record(instance)
        self._note_membership_change()
        self._record()
        return lost

    def _check_starving(self) -> None:
        """Fails the job when it has had no running worker, or a PS shard not running, for
        ``starve_timeout_s``: the pending instances' reasons say why."""
        lack = _what_starves(self.instances.values(), self.settings.num_ps)
        now = self._clock()
        if lack is None or self._starving_since is None:
            self._starving_since = None if lack is None else now
            return
        if now - self._starving_since < self.settings.starve_timeout_s:
            return
        waiting = [f"{i.name}: {i.message}" for i in self.live(Role.WORKER) + self.live(Role.PS)]
        self.failure = (
            f"{lack} has been running for {self.settings.starve_timeout_s:.0f} s "
            f"(--master-timeout); pending: {'; '.join(waiting) or 'none'}"
        )
        self._changed.add("failure")
        self._record()

    def note_standby_ready(self, name: str) -> None:
        """Standby ``name`` has loaded everything and waits: it may be given a worker slot."""
        instance = self.instances.get(name)
        if instance is not None and instance.role is Role.STANDBY and not instance.state.ended:
            if name not in self._ready_standbys:  # it asks again until it has a slot
                log.info("%s is ready to take the next worker slot that frees up", name)
            self._ready_standbys.setdefault(name)

    def is_standby(self, name: str) -> bool:
        instance = self.instances.get(name)
        return instance is not None and instance.role is Role.STANDBY

    def _promote_standby(self, slot: int) -> bool:
        """Moves the oldest ready standby into worker slot ``slot``; says whether one was."""
        while self._ready_standbys:
            name = next(iter(self._ready_standbys))
            del self._ready_standbys[name]
            instance = self.instances.get(name)
            if instance is None or instance.state.ended or instance.role is not Role.STANDBY:
                continue
            standby_slot = instance.slot
            instance.role, instance.slot = Role.WORKER, slot
            self.promotions += 1
            self._journal({"op": "promoted"})
            self._note_membership_change()
            self._record(instance)
            log.info(
                "%s takes worker slot %d at once (a standby, TensorFlow loaded); "
                "a new standby will take its place in standby slot %d",
                name,
                slot,
                standby_slot,
            )
            return True
        return False

    def dismiss(self, name: str) -> None:
        """The master told ``name`` that the job is over: its exit 0 will be a success."""
        self.dismissed.add(name)

    def is_retiring(self, name: str) -> bool:
        """Whether ``name`` is a live worker whose slot was given back: it is to finish the
        task in hand and exit."""
        instance = self.instances.get(name)
        return (
            instance is not None
            and instance.role is Role.WORKER
            and not instance.state.ended
            and instance.slot not in self.worker_slots
        )

    def note_task_done(self, name: str, records: int = 0) -> None:
        """A worker finished a task of ``records`` training (or prediction) records: its
        slot is healthy, so its failure backoff resets, and the work counts for sizing."""
        self.sizing.note_task_done(name, records)
        instance = self.instances.get(name)
        if instance and self.relaunch.note_task_done(self._slot_key(instance.role, instance.slot)):
            self._record()

    def note_pid(self, name: str, pid: int) -> None:
        instance = self.instances.get(name)
        if instance is not None and pid and instance.pid != pid:
            instance.pid = pid
            self._record(instance)

    def delete_all(self, grace_period_s: float) -> None:
        """Stops every live instance; nothing is relaunched afterwards."""
        self.stopping = True
        for instance in list(self.instances.values()):
            if not instance.state.ended:
                self._backend.delete(instance.name, grace_period_s=grace_period_s)

    # -- persistence --

    def snapshot(self) -> dict:
        """Everything needed to resume: the instances on record and the membership."""
        return {
            "instances": [i.to_json() for i in self.instances.values()],
            "worker_slots": sorted(self.worker_slots),
            **self.relaunch.snapshot(),
            "started_at": self.started_at,
            "timeline": [list(point) for point in self.timeline],
            "failure": self.failure,
            **self.names.snapshot(),
            "promotions": self.promotions,
            "sizing_decisions": [dict(d) for d in self.sizing.decisions],
        }

    def restore(self, state: dict) -> None:
        """Loads a :meth:`snapshot` (nothing is launched or journaled)."""
        self.instances = {d["name"]: Instance.from_json(d) for d in state["instances"]}
        self.worker_slots = set(state["worker_slots"])
        self.relaunch.restore(state)
        self.started_at = state["started_at"]
        self.timeline = [list(point) for point in state["timeline"]]
        self.failure = state["failure"]
        self.names.restore(state)
        self.promotions = state.get("promotions", 0)
        for decision in state.get("sizing_decisions", []):  # absent before sizing policies
            self.sizing.add(decision)

    def apply(self, record: dict) -> None:
        """Replays one journal record, as :meth:`_record` wrote it."""
        match record["op"]:
            case "instance":
                self._add(Instance.from_json(record["instance"]))
            case "slot" | "restarts" | "restart":
                self.relaunch.apply(record)
            case "slots":
                self.worker_slots = set(record["worker_slots"])
            case "failure":
                self.failure = record["failure"]
            case "timeline":
                self._add_point(record["point"])
            case "promoted":
                self.promotions += 1
            case "sizing":
                self.sizing.add(record["decision"])
            case op:
                raise ValueError(f"unknown instance record kind {op!r}")

    def _record(self, instance: Instance | None = None) -> None:
        """Journals ``instance`` and whatever else changed, each as one small record.

        ``instance`` goes (back) on record the way a replay puts it there (:meth:`_add`)."""
        if instance is not None:
            self._add(instance)
            self._journal({"op": "instance", "instance": instance.to_json()})
        for group in sorted(self._changed):
            if group.startswith("slot:"):
                self._journal(self.relaunch.slot_record(group[len("slot:") :]))
            elif group == "restarts":
                self._journal(self.relaunch.counts_record())
            elif group == "slots":
                self._journal({"op": "slots", "worker_slots": sorted(self.worker_slots)})
            elif group == "failure":
                self._journal({"op": "failure", "failure": self.failure})
        for point in self._new_points:
            self._journal({"op": "timeline", "point": point})
        for event in self.relaunch.new_events:
            self._journal({"op": "restart", "event": event})
        self._changed.clear()
        self._new_points.clear()
        self.relaunch.new_events.clear()

    def _add(self, instance: Instance) -> None:
        """Puts ``instance`` on record, notes its name, and forgets the oldest ended ones."""
        self.instances[instance.name] = instance
        self.names.note(instance.name, instance.role, instance.slot)
        if instance.state.ended:
            ended = [name for name, i in self.instances.items() if i.state.ended]
            for name in ended[: max(len(ended) - KEEP_ENDED, 0)]:
                del self.instances[name]

    def _add_point(self, point: list[float]) -> None:
        self.timeline.append(list(point))
        if len(self.timeline) > MAX_TIMELINE:
            del self.timeline[1]

    def elapsed_s(self) -> float:
        """Seconds since the job first started, on the timeline's clock."""
        return round(self._clock() - self.started_at, 3)

    # -- internals --

    @staticmethod
    def _slot_key(role: Role, slot: int) -> str:
        return f"{role.value}-{slot}"

    def _launch(self, role: Role, slot: int) -> None:
        name = self.names.next(role, slot)
        spec = self._spec_for(role, slot, name)
        self._backend.launch(spec)
        if role is Role.WORKER:
            self.sizing.note_waiting(slot)
        self._record(Instance(name, role, slot))
        log.info("launched %s (%s slot %d)", name, role.value, slot)

    def _apply_relaunch_policy(self, instance: Instance) -> None:
        """Asks the relaunch policy about the slot of ``instance``, which ended; fails the job
        when the policy gives up a PS shard, or more worker slots than ``min_workers`` allows.
        """
        key = self._slot_key(instance.role, instance.slot)
        if self.relaunch.judge(instance, key, stopping=self.stopping) is not Verdict.GIVEN_UP:
            return
        what, used = instance.describe_end(), self.relaunch.error_restarts.get(key, 0)
        if instance.role is Role.STANDBY:  # costs speed only: the job goes on without it
            self.relaunch.retired.add(key)
            log.error("%s; giving up standby slot %d after %d restarts", what, instance.slot, used)
            return
        self._changed.add("failure")
        if instance.role is Role.PS:
            self.failure = (
                f"parameter server shard {instance.slot} failed more than "
                f"--max-restarts={self.settings.max_restarts} times; last: {what}"
            )
        else:
            self.worker_slots.discard(instance.slot)
            self._changed.add("slots")
            log.error("%s; giving up worker slot %d after %d restarts", what, instance.slot, used)
            if len(self.worker_slots) < self.settings.min_workers:
                self.failure = (
                    f"only {len(self.worker_slots)} worker slots are left, fewer than "
                    f"--min-workers={self.settings.min_workers}; last: {what}"
                )

    def _resize(self) -> None:
        """Asks the sizing policy, and applies and journals what it decides."""
        view = self.sizing.view(
            elapsed_s=self.elapsed_s(),
            slots=self.worker_slots,
            workers=self.live(Role.WORKER),
            stable_for_s=self._clock() - self._last_change,
        )
        decision = self.sizing.policy.decide(view)
        if decision is None:
            return
        log.info(
            "worker sizing (%s): %s -> %s workers: %s",
            self.sizing.policy.name,
            decision.workers_from,
            decision.workers_to,
            decision.reason,
        )
        if decision.action is SizingAction.GROW:
            slot = self._free_worker_slot()
            self.worker_slots.add(slot)
            self.sizing.note_waiting(slot)
            self._changed.add("slots")
        elif decision.action is SizingAction.SHRINK:
            self._give_back(max(self.worker_slots))
        self._last_change = self._clock()
        self.sizing.add(decision.to_json(), replay=False)
        self._journal({"op": "sizing", "decision": decision.to_json()})
        self._record()

    def _free_worker_slot(self) -> int:
        """The lowest slot number neither wanted nor given back before."""
        slot = 0
        while slot in self.worker_slots or self._slot_key(Role.WORKER, slot) in (
            self.relaunch.retired
        ):
            slot += 1
        return slot

    def _give_back(self, slot: int) -> None:
        """Retires worker slot ``slot``: a pending instance there is deleted, a running one
        is told at its next call that the job is over for it (:meth:`is_retiring`)."""
        key = self._slot_key(Role.WORKER, slot)
        self.worker_slots.discard(slot)
        self.sizing.note_running(slot)  # no longer waited for
        self.relaunch.retired.add(key)
        self._changed.update({"slots", f"slot:{key}"})
        for instance in self.live(Role.WORKER):
            if instance.slot == slot and instance.state is not ProcessState.RUNNING:
                self._backend.delete(instance.name, grace_period_s=0)

    def _note_membership_change(self) -> None:
        self._last_change = self._clock()
        running = self.running_workers()
        if self.timeline[-1][1] != running:
            point = [self.elapsed_s(), running]
            self._add_point(point)
            self._new_points.append(point)


def _what_starves(instances: Iterable[Instance], num_ps: int) -> str | None:
    """ "no worker" or "not every PS" when that is not running; None when the job can run."""
    running = [i for i in instances if i.state is ProcessState.RUNNING]
    if not any(i.role is Role.WORKER for i in running):
        return "no worker"
    if len({i.slot for i in running if i.role is Role.PS}) < num_ps:
        return "not every PS"
    return None
