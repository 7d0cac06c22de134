"""The instance manager: launching, the relaunch policy, growth, adoption after a master
restart, the timeline and persistence, against a fake backend and a fake clock."""

from __future__ import annotations

import json

from fake_backend import FakeBackend, FakeClock

from elastic_step.backends.api import (
    BackendError,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchSpec,
    Role,
)
from elastic_step.master.instances.api import MembershipSettings
from elastic_step.master.instances.instance_manager import MAX_LAUNCH_ERRORS, InstanceManager
from elastic_step.master.instances.process_state import (
    ProcessState,
    Transition,
    next_state,
    transition_of,
)


def spec_for(role: Role, slot: int, name: str) -> LaunchSpec:
    return LaunchSpec(name, role, slot, ["python", "-m", "elastic_step", role.value])


def make(backend=None, clock=None, **overrides) -> InstanceManager:
    settings = {
        "workers": 2,
        "min_workers": 1,
        "max_workers": 2,
        "num_ps": 1,
        "max_restarts": 2,
        "grow_after_s": 10.0,
        "backoff_s": 0.0,
        **overrides,
    }
    return InstanceManager(
        backend or FakeBackend(), MembershipSettings(**settings), spec_for, clock or FakeClock()
    )


def pump(manager: InstanceManager) -> list:
    """Applies the backend's queued events; returns the instances that ended."""
    ended = [manager.handle(e) for e in manager._backend.next_events(0)]
    return [i for i in ended if i is not None]


def started(manager: InstanceManager) -> InstanceManager:
    manager.reconcile()
    pump(manager)
    return manager


def kill(manager: InstanceManager, name: str) -> None:
    """Ends ``name`` through no fault of its own (preempted)."""
    manager._backend.end(name, ExitReason.PREEMPTED, message="preempted")
    pump(manager)


def crash(manager: InstanceManager, name: str, code: int = 1) -> None:
    manager._backend.end(name, ExitReason.CRASHED, code, f"exit status {code}")
    pump(manager)


def live_worker(manager: InstanceManager, slot: int) -> str:
    [instance] = [i for i in manager.live(Role.WORKER) if i.slot == slot]
    return instance.name


def round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state))


# -- starting --


def test_start_launches_the_ps_then_the_workers() -> None:
    backend = FakeBackend()
    manager = make(backend, num_ps=2, workers=3, max_workers=3)
    manager.reconcile()

    assert [(s.name, s.role, s.index) for s in backend.launched] == [
        ("ps-0", Role.PS, 0),
        ("ps-1", Role.PS, 1),
        ("worker-0", Role.WORKER, 0),
        ("worker-1", Role.WORKER, 1),
        ("worker-2", Role.WORKER, 2),
    ]
    assert all(i.state is ProcessState.PENDING for i in manager.instances.values())
    assert manager.running_workers() == 0

    pump(manager)
    assert all(i.state is ProcessState.RUNNING for i in manager.instances.values())
    assert manager.instances["worker-2"].pid == backend.live["worker-2"].pid
    assert manager.running_workers() == 3

    manager.reconcile()
    assert len(backend.launched) == 5  # every slot has its instance


# -- the relaunch policy --


def test_a_preempted_worker_is_always_replaced() -> None:
    backend = FakeBackend()
    manager = started(make(backend, max_restarts=0))
    for _ in range(4):
        kill(manager, live_worker(manager, 0))
        manager.reconcile()
        pump(manager)

    assert manager.restarts == {"worker": 4, "ps": 0}
    assert manager.restarts_by_reason == {"preempted": 4}
    assert manager.relaunch.error_restarts == {}
    assert manager.failure is None
    assert manager.worker_slots == {0, 1}
    assert manager.running_workers() == 2


def test_an_error_exit_is_replaced_max_restarts_times_then_the_slot_is_given_up() -> None:
    backend = FakeBackend()
    manager = started(make(backend, workers=3, max_workers=3, max_restarts=2))
    for _ in range(2):
        crash(manager, live_worker(manager, 1))
        manager.reconcile()
        pump(manager)
        assert manager.worker_slots == {0, 1, 2}
    launches = len(backend.launched)

    name = live_worker(manager, 1)
    crash(manager, name, code=3)
    manager.reconcile()

    assert manager.instances[name].state is ProcessState.FAILED
    assert manager.instances[name].exit_code == 3
    assert manager.worker_slots == {0, 2}
    assert len(backend.launched) == launches  # not replaced
    assert manager.restarts["worker"] == 2
    assert manager.failure is None  # 2 slots left, --min-workers=1


def test_error_restarts_are_counted_per_slot() -> None:
    manager = started(make(max_restarts=1))
    crash(manager, live_worker(manager, 0))
    manager.reconcile()
    pump(manager)
    crash(manager, live_worker(manager, 1))  # slot 1's first error: still within its budget
    manager.reconcile()
    pump(manager)

    assert manager.worker_slots == {0, 1}
    assert manager.running_workers() == 2


def test_fewer_worker_slots_than_min_workers_fails_the_job() -> None:
    backend = FakeBackend()
    manager = started(make(backend, min_workers=2, max_restarts=0))
    crash(manager, "worker-1", code=2)

    assert manager.failure is not None
    assert "only 1 worker slots are left" in manager.failure
    assert "--min-workers=2" in manager.failure
    assert "worker-1" in manager.failure
    launches = len(backend.launched)
    manager.reconcile()
    assert len(backend.launched) == launches  # a failed membership launches nothing


def test_ps_names_on_relaunch_and_ps_errors_past_max_restarts_fail_the_job() -> None:
    backend = FakeBackend()
    manager = started(make(backend, max_restarts=1))
    kill(manager, "ps-0")
    manager.reconcile()
    pump(manager)
    crash(manager, "ps-0-1")  # the one error restart it is allowed
    manager.reconcile()
    pump(manager)
    assert [n for n in backend.names() if n.startswith("ps")] == ["ps-0", "ps-0-1", "ps-0-2"]
    assert manager.restarts["ps"] == 2
    assert manager.failure is None

    crash(manager, "ps-0-2", code=4)

    assert manager.failure is not None
    assert "parameter server shard 0" in manager.failure
    assert "--max-restarts=1" in manager.failure
    assert "ps-0-2" in manager.failure
    manager.reconcile()
    assert backend.names()[-1] == "ps-0-2"


def test_worker_names_are_never_reused() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    for slot in (0, 1, 0, 1, 1):
        kill(manager, live_worker(manager, slot))
        manager.reconcile()
        pump(manager)

    workers = [n for n in backend.names() if n.startswith("worker")]
    assert workers == [f"worker-{i}" for i in range(7)]


def test_nothing_is_relaunched_after_delete_all() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    manager.delete_all(grace_period_s=3)

    assert sorted(backend.deleted) == [("ps-0", 3), ("worker-0", 3), ("worker-1", 3)]
    ended = pump(manager)
    assert {i.name for i in ended} == {"ps-0", "worker-0", "worker-1"}
    manager.reconcile()
    assert len(backend.launched) == 3
    assert manager.restarts == {"worker": 0, "ps": 0}
    assert manager.failure is None


def test_a_dismissed_worker_that_exited_with_status_0_is_not_replaced() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    manager.dismiss("worker-0")
    backend.end("worker-0", ExitReason.COMPLETED, 0, "exit status 0")
    [ended] = pump(manager)
    assert ended.state is ProcessState.SUCCEEDED
    assert manager.restarts["worker"] == 0

    manager.reconcile()

    assert backend.names() == ["ps-0", "worker-0", "worker-1"]


def test_an_adopted_worker_that_exits_unseen_after_its_dismissal_is_done_not_lost() -> None:
    # An adopted local process's exit status goes to init: the backend says "lost". Once the
    # master has dismissed it, exiting was its job; before that, it is lost and replaced.
    backend = FakeBackend()
    manager = started(make(backend))
    manager.dismiss("worker-0")
    backend.end("worker-0", ExitReason.LOST, None, "exited (status unknown: not our child)")
    backend.end("worker-1", ExitReason.LOST, None, "exited (status unknown: not our child)")
    done, lost = pump(manager)
    assert done.state is ProcessState.SUCCEEDED
    assert "after the master dismissed it" in done.message
    assert lost.state is ProcessState.KILLED
    assert manager.restarts["worker"] == 1

    manager.reconcile()

    assert backend.names() == ["ps-0", "worker-0", "worker-1", "worker-2"]


# -- growth --


def test_the_job_grows_to_max_workers_after_grow_after_s() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    manager = started(make(backend, clock, workers=1, max_workers=3, grow_after_s=10.0))
    assert backend.names() == ["ps-0", "worker-0"]

    clock.now = 109.0
    manager.reconcile()
    assert backend.names() == ["ps-0", "worker-0"]  # not yet

    clock.now = 110.0
    manager.reconcile()
    assert backend.names()[-1] == "worker-1"
    assert manager.worker_slots == {0, 1}

    clock.now = 130.0
    manager.reconcile()  # worker-1 is not running yet: no growth
    assert manager.worker_slots == {0, 1}
    pump(manager)  # worker-1 runs from t=130

    clock.now = 135.0
    manager.reconcile()
    assert manager.worker_slots == {0, 1}
    clock.now = 140.0
    manager.reconcile()
    pump(manager)
    assert manager.worker_slots == {0, 1, 2}
    assert manager.running_workers() == 3

    clock.now = 1000.0
    manager.reconcile()
    assert manager.worker_slots == {0, 1, 2}  # --max-workers=3
    assert len(backend.launched) == 4


def test_no_growth_without_max_workers_above_workers() -> None:
    clock = FakeClock()
    backend = FakeBackend()
    manager = started(make(backend, clock))
    clock.now += 1000
    manager.reconcile()
    assert manager.worker_slots == {0, 1}
    assert len(backend.launched) == 3


def test_a_rejected_launch_is_retried_after_the_backoff() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    backend.reject = 1
    manager = make(backend, clock)

    manager.reconcile()
    assert backend.launched == []
    assert manager.instances == {}
    assert manager.failure is None

    clock.now = 102.0
    manager.reconcile()
    assert backend.launched == []  # still backing off

    clock.now = 106.0
    manager.reconcile()
    assert backend.names() == ["ps-0", "worker-0", "worker-1"]


# -- adoption after a master restart --


def restarted(backend: FakeBackend, state: dict, **overrides) -> InstanceManager:
    manager = make(backend, **overrides)
    manager.restore(round_trip(state))
    return manager


def test_adopt_keeps_live_instances_and_returns_the_lost_ones() -> None:
    backend = FakeBackend()
    first = make(backend, workers=3, max_workers=3)
    first.reconcile()  # the master dies before any STARTED event: all PENDING in the record
    state = round_trip(first.snapshot())
    backend.events.clear()
    backend.live.pop("worker-1")  # died while no master was watching

    manager = restarted(backend, state, workers=3, max_workers=3)
    lost = manager.adopt(backend.list_instances())

    assert [i.name for i in lost] == ["worker-1"]
    assert lost[0].state is ProcessState.KILLED
    assert "lost while the master was away" in lost[0].message
    for name in ("ps-0", "worker-0", "worker-2"):
        assert manager.instances[name].state is ProcessState.RUNNING
        assert manager.instances[name].pid == backend.live[name].pid
    assert manager.restarts["worker"] == 1

    manager.reconcile()
    assert backend.names()[-1] == "worker-3"  # the lost slot is refilled under a new name
    assert backend.launched[-1].index == 1
    assert len(backend.launched) == 5


def test_adopt_takes_unrecorded_live_instances_into_free_slots_or_deletes_them() -> None:
    backend = FakeBackend()
    first = started(make(backend))
    state = round_trip(first.snapshot())
    # After the save, the old master replaced worker-0 (as worker-2) and then, for slot 1,
    # launched a duplicate worker-3, and died before saving again.
    backend.live.pop("worker-0")
    backend.live["worker-2"] = InstanceInfo("worker-2", Role.WORKER, 0, 4242)
    backend.live["worker-3"] = InstanceInfo("worker-3", Role.WORKER, 1, 4343)

    manager = restarted(backend, state)
    lost = manager.adopt(backend.list_instances())

    assert [i.name for i in lost] == ["worker-0"]
    adopted = manager.instances["worker-2"]
    assert (adopted.role, adopted.slot, adopted.state, adopted.pid) == (
        Role.WORKER,
        0,
        ProcessState.RUNNING,
        4242,
    )
    assert [name for name, _ in backend.deleted] == ["worker-3"]
    # Kept on record as ended, so that its name is never given out again.
    assert manager.instances["worker-3"].state is ProcessState.KILLED
    assert "worker-3" not in [i.name for i in manager.live(Role.WORKER)]
    assert manager.instances["worker-1"].state is ProcessState.RUNNING

    launches = len(backend.launched)
    manager.reconcile()
    assert len(backend.launched) == launches  # both slots are occupied
    assert manager.running_workers() == 2


def test_a_name_adopted_from_the_backend_is_not_reused() -> None:
    backend = FakeBackend()
    first = started(make(backend))
    state = round_trip(first.snapshot())  # records worker-0, worker-1
    kill(first, "worker-1")
    first.reconcile()  # launches worker-2 for slot 1; the master dies before saving
    assert backend.names()[-1] == "worker-2"

    manager = restarted(backend, state)
    manager.adopt(backend.list_instances())  # worker-1 lost; worker-2 adopted into slot 1
    assert manager.instances["worker-2"].state is ProcessState.RUNNING
    kill(manager, "worker-0")
    manager.reconcile()

    names = backend.names()
    assert len(names) == len(set(names)), f"a name was launched twice: {names}"


def test_timeline_records_changes_in_running_workers() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    manager = make(backend, clock)
    manager.reconcile()
    clock.now = 101.5
    pump(manager)  # ps-0 starts too, but only workers count
    clock.now = 105.0
    kill(manager, "worker-0")
    clock.now = 106.25
    manager.reconcile()
    pump(manager)

    assert manager.timeline == [[0.0, 0], [1.5, 1], [1.5, 2], [5.0, 1], [6.25, 2]]


def test_each_restart_is_recorded_with_its_time_instance_and_reason() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    records: list[dict] = []
    manager = make(backend, clock)
    manager._journal = records.append
    base = round_trip(manager.snapshot())
    started(manager)
    clock.now = 104.0
    kill(manager, "worker-0")
    manager.reconcile()
    pump(manager)
    clock.now = 107.5
    crash(manager, "ps-0")

    assert manager.restart_events == [
        {"at_s": 4.0, "instance": "worker-0", "role": "worker", "reason": "preempted"},
        {"at_s": 7.5, "instance": "ps-0", "role": "ps", "reason": "crashed"},
    ]
    # A restarted master has them, from its snapshot or by replaying the journal.
    assert restarted(backend, round_trip(manager.snapshot())).restart_events == (
        manager.restart_events
    )
    replayed = make(FakeBackend(), clock)
    replayed.restore(base)
    for record in round_trip(records):
        replayed.apply(record)
    assert replayed.restart_events == manager.restart_events


# -- persistence and the transition table --


def test_state_round_trip_keeps_membership_counters_and_names() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    first = started(make(backend, clock, workers=3, max_workers=3, max_restarts=1))
    crash(first, "worker-0")
    first.reconcile()
    pump(first)  # worker-3 for slot 0, which has used its one error restart
    crash(first, "worker-1")
    first.reconcile()  # worker-4 for slot 1
    crash(first, "worker-2")  # slot 2's one restart: worker-5 not yet launched
    state = round_trip(first.snapshot())

    manager = make(backend, clock, workers=3, max_workers=3, max_restarts=1)
    manager.restore(state)

    assert {n: (i.role, i.slot, i.state, i.pid) for n, i in manager.instances.items()} == {
        n: (i.role, i.slot, i.state, i.pid) for n, i in first.instances.items()
    }
    assert manager.worker_slots == {0, 1, 2}
    assert manager.restarts == {"worker": 3, "ps": 0}
    assert manager.relaunch.error_restarts == {"worker-0": 1, "worker-1": 1, "worker-2": 1}
    assert manager.timeline == first.timeline
    assert manager.started_at == first.started_at

    manager.reconcile()  # slot 2 gets its replacement, under a new name
    assert backend.names()[-1] == "worker-5"
    pump(manager)
    crash(manager, "worker-3")  # slot 0's budget was used before the restart
    assert manager.worker_slots == {1, 2}


def test_the_failure_survives_a_state_round_trip() -> None:
    backend = FakeBackend()
    first = started(make(backend, max_restarts=0))
    crash(first, "ps-0")
    manager = restarted(backend, first.snapshot(), max_restarts=0)
    assert manager.failure == first.failure
    assert "parameter server shard 0" in manager.failure


def test_stale_and_duplicate_events_are_ignored() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    crash(manager, "worker-0")
    manager.reconcile()
    assert manager.restarts["worker"] == 1
    launches = len(backend.launched)

    # A late STARTED after the exit, then a second EXITED for the same instance.
    assert manager.handle(InstanceEvent("worker-0", EventKind.STARTED, pid=1)) is None
    assert manager.instances["worker-0"].state is ProcessState.FAILED
    again = InstanceEvent("worker-0", EventKind.EXITED, None, ExitReason.LOST, "gone")
    assert manager.handle(again) is None
    assert manager.instances["worker-0"].state is ProcessState.FAILED
    assert manager.restarts["worker"] == 1
    assert manager.relaunch.error_restarts == {"worker-0": 1}
    manager.reconcile()
    assert len(backend.launched) == launches

    assert manager.handle(InstanceEvent("worker-99", EventKind.STARTED)) is None
    assert "worker-99" not in manager.instances


def test_a_pending_instance_may_end_before_it_started() -> None:
    backend = FakeBackend()
    manager = make(backend)
    manager.reconcile()
    backend.events.clear()
    ended = manager.handle(
        InstanceEvent("worker-1", EventKind.EXITED, None, ExitReason.PREEMPTED, "preempted")
    )
    assert ended is not None and ended.state is ProcessState.KILLED
    assert ended.message == "preempted"
    assert manager.restarts["worker"] == 1


def test_transition_table() -> None:
    assert next_state(ProcessState.PENDING, Transition.STARTED) is ProcessState.RUNNING
    assert next_state(ProcessState.RUNNING, Transition.STARTED) is ProcessState.RUNNING
    assert next_state(ProcessState.RUNNING, Transition.COMPLETED) is ProcessState.SUCCEEDED
    assert next_state(ProcessState.RUNNING, Transition.FAILED) is ProcessState.FAILED
    assert next_state(ProcessState.PENDING, Transition.KILLED) is ProcessState.KILLED
    for ended in (ProcessState.SUCCEEDED, ProcessState.FAILED, ProcessState.KILLED):
        assert ended.ended
        for transition in Transition:
            assert next_state(ended, transition) is None
    assert not ProcessState.PENDING.ended and not ProcessState.RUNNING.ended


def test_transition_of_events() -> None:
    def exited(reason):
        return InstanceEvent("w", EventKind.EXITED, None, reason)

    assert transition_of(InstanceEvent("w", EventKind.STARTED)) is Transition.STARTED
    assert transition_of(exited(ExitReason.COMPLETED)) is Transition.COMPLETED
    # Only the program's own faults fail it; the platform's and the master's doings do not.
    assert transition_of(exited(ExitReason.CRASHED)) is Transition.FAILED
    assert transition_of(exited(ExitReason.OOM_KILLED)) is Transition.FAILED
    for reason in (ExitReason.DELETED, ExitReason.PREEMPTED, ExitReason.EVICTED):
        assert transition_of(exited(reason)) is Transition.KILLED
    assert transition_of(exited(None)) is Transition.KILLED  # an unknown end is not a failure


# -- stops, backoff, launch errors, the journal --


def test_an_exit_0_before_the_master_dismissed_the_worker_is_a_crash() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    backend.end("worker-1", ExitReason.COMPLETED, 0, "exit status 0")
    [ended] = pump(manager)
    assert (ended.state, ended.reason) == (ProcessState.FAILED, "crashed")
    assert "before the master dismissed it" in ended.message
    assert manager.relaunch.retired == set()
    manager.reconcile()
    assert backend.names()[-1] == "worker-2"  # the slot is refilled, not retired


def test_an_exit_0_during_a_stop_is_not_taken_for_success() -> None:
    backend = FakeBackend()
    manager = started(make(backend))
    manager.stopping = True  # as delete_all sets it, before any delete lands
    backend.end("worker-0", ExitReason.COMPLETED, 0, "exit status 0")
    [ended] = pump(manager)

    assert ended.state is ProcessState.KILLED
    assert manager.relaunch.retired == set()  # a resumed job relaunches the slot

    resumed = restarted(FakeBackend(), manager.snapshot())
    resumed.adopt([])
    resumed.reconcile()
    assert sorted(s.index for s in resumed._backend.launched if s.role is Role.WORKER) == [0, 1]


def test_a_slot_that_keeps_failing_before_any_task_backs_off_exponentially() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    manager = started(make(backend, clock, max_restarts=10, backoff_s=1.0, backoff_max_s=4.0))
    relaunched_at = []
    for _ in range(5):
        crash(manager, live_worker(manager, 0))
        start = clock.now
        while not [i for i in manager.live(Role.WORKER) if i.slot == 0]:
            manager.reconcile()
            clock.now += 0.25
        relaunched_at.append(clock.now - 0.25 - start)
        pump(manager)

    # The first failure is relaunched at once, then 1, 2, 4 s, capped at --backoff-max 4 s.
    assert relaunched_at == [0.0, 1.0, 2.0, 4.0, 4.0]


def test_a_finished_task_resets_the_backoff() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    manager = started(make(backend, clock, max_restarts=10, backoff_s=1.0))
    crash(manager, live_worker(manager, 0))
    manager.reconcile()
    pump(manager)
    manager.note_task_done(live_worker(manager, 0))
    crash(manager, live_worker(manager, 0))
    manager.reconcile()

    assert [i.slot for i in manager.live(Role.WORKER)].count(0) == 1  # relaunched at once


class BrokenBackend(FakeBackend):
    def launch(self, spec: LaunchSpec) -> None:
        raise BackendError("pods is forbidden: cannot create resource pods")


def test_launch_errors_are_retried_with_backoff_then_fail_the_job() -> None:
    clock = FakeClock(100.0)
    manager = make(BrokenBackend(), clock, starve_timeout_s=1e9)
    attempts = 0
    while manager.failure is None and attempts < 50:
        manager.reconcile()  # must not raise: the master lives on
        attempts += 1
        clock.now += 120
    assert manager.failure is not None
    assert "pods is forbidden" in manager.failure
    assert attempts == MAX_LAUNCH_ERRORS + 1


def test_journal_replay_rebuilds_the_same_membership() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    records: list[dict] = []
    first = make(backend, clock, workers=2, max_workers=3, max_restarts=2)
    first._journal = records.append
    base = round_trip(first.snapshot())
    first.reconcile()
    pump(first)
    crash(first, "worker-0")
    clock.now += 20
    first.reconcile()  # relaunches slot 0 and grows to 3 workers
    pump(first)
    kill(first, "ps-0")
    first.reconcile()
    first.note_pid("worker-1", 777)

    replayed = make(FakeBackend(), clock, workers=2, max_workers=3, max_restarts=2)
    replayed.restore(base)
    for record in round_trip(records):
        replayed.apply(record)
    assert replayed.snapshot() == round_trip(first.snapshot())
    assert all(len(json.dumps(r)) < 1000 for r in records if r["op"] == "instance")


def test_a_pending_instance_waits_without_using_restarts_and_joins_when_it_starts() -> None:
    backend = FakeBackend()
    manager = make(backend)
    manager.reconcile()
    backend.events.clear()
    reason = "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu"
    for _ in range(3):
        assert manager.handle(InstanceEvent("worker-1", EventKind.PENDING, message=reason)) is None
    pending = manager.instances["worker-1"]
    assert (pending.state, pending.message) == (ProcessState.PENDING, reason)
    assert manager.restarts == {"worker": 0, "ps": 0}
    manager.reconcile()
    assert backend.names() == ["ps-0", "worker-0", "worker-1"]  # not relaunched

    manager.handle(InstanceEvent("worker-1", EventKind.STARTED, pid=7))
    assert (pending.state, pending.message) == (ProcessState.RUNNING, "")
    # A late PENDING after the start is stale.
    assert manager.handle(InstanceEvent("worker-1", EventKind.PENDING, message="x")) is None
    assert pending.state is ProcessState.RUNNING


def test_records_stay_small_and_the_state_bounded_at_scale() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    records: list[dict] = []
    manager = make(backend, clock, workers=1000, max_workers=1000, max_restarts=10**6)
    manager._journal = records.append
    base = round_trip(manager.snapshot())
    for _ in range(40):  # 1,000 workers and a PS start, 32 launches a tick
        manager.reconcile()
        pump(manager)
    assert manager.running_workers() == 1000
    for i in range(3000):  # a long job: thousands of preemptions
        clock.now += 1
        kill(manager, live_worker(manager, i % 1000))
        manager.reconcile()
        pump(manager)

    assert max(len(json.dumps(r)) for r in records) < 1000
    state = json.dumps(manager.snapshot())
    assert len(state) < 400_000, len(state)
    assert len(manager.timeline) <= 1000 and manager.timeline[0] == [0.0, 0]
    assert manager.restarts["worker"] == 3000
    assert len(manager.restart_events) == 1000
    assert manager.restart_events[-1]["at_s"] == 3000.0
    assert (
        manager.names.next_worker == 4000
    )  # names are never reused, though old ones are forgotten
    replayed = make(FakeBackend(), clock, workers=1000, max_workers=1000, max_restarts=10**6)
    replayed.restore(base)
    for record in round_trip(records):
        replayed.apply(record)
    assert replayed.snapshot() == round_trip(manager.snapshot())


def test_a_job_whose_workers_never_run_fails_after_the_starve_timeout() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    manager = make(backend, clock, starve_timeout_s=300.0)
    manager.reconcile()
    backend.events.clear()  # nothing ever starts
    reason = "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu"
    manager.handle(InstanceEvent("worker-0", EventKind.PENDING, message=reason))
    for _ in range(10):
        clock.now += 29
        manager.reconcile()
    assert manager.failure is None  # 290 s: still waiting
    clock.now += 20
    manager.reconcile()
    assert manager.failure is not None
    assert manager.failure.startswith("no worker has been running for 300 s")
    assert f"worker-0: {reason}" in manager.failure


def test_running_workers_keep_the_starve_clock_at_zero() -> None:
    clock = FakeClock(100.0)
    manager = started(make(FakeBackend(), clock, starve_timeout_s=10.0))
    for _ in range(5):
        clock.now += 100
        manager.reconcile()
    assert manager.failure is None


# -- standbys --


def test_a_ready_standby_takes_a_dead_workers_slot_and_a_new_standby_starts() -> None:
    clock = FakeClock(100.0)
    backend = FakeBackend()
    records: list[dict] = []
    manager = make(backend, clock, standby=1, max_restarts=2)
    manager._journal = records.append
    base = round_trip(manager.snapshot())
    started(manager)
    assert backend.names() == ["ps-0", "worker-0", "worker-1", "standby-0"]
    assert manager.running_workers() == 2  # a standby takes no slot

    crash(manager, "worker-0")
    manager.reconcile()  # not ready yet: a new worker is launched, as without standbys
    assert backend.names()[-1] == "worker-2"
    pump(manager)

    manager.note_standby_ready("standby-0")
    crash(manager, "worker-1")
    manager.reconcile()
    promoted = manager.instances["standby-0"]
    assert (promoted.role, promoted.slot) == (Role.WORKER, 1)
    assert backend.names()[-1] == "worker-2"  # no launch for the slot
    assert manager.running_workers() == 2 and manager.promotions == 1
    manager.reconcile()  # the standby slot is refilled
    assert backend.names()[-1] == "standby-1"
    assert manager.restarts == {"worker": 2, "ps": 0}

    replayed = make(FakeBackend(), clock, standby=1, max_restarts=2)
    replayed.restore(base)
    for record in round_trip(records):
        replayed.apply(record)
    assert replayed.snapshot() == round_trip(manager.snapshot())


def test_a_standby_that_keeps_crashing_is_given_up_and_the_job_goes_on() -> None:
    manager = started(make(standby=1, max_restarts=1))
    crash(manager, "standby-0")
    manager.reconcile()
    pump(manager)
    crash(manager, "standby-1")
    manager.reconcile()
    assert manager.failure is None
    assert [i.name for i in manager.live(Role.STANDBY)] == []
    assert manager.restarts == {"worker": 0, "ps": 0, "standby": 1}
    assert manager.running_workers() == 2
