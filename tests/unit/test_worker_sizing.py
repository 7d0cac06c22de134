"""Worker sizing: the throughput policy (--auto-workers) on its own, driven by views of a job
whose examples/s is a given function of its worker count, and through the instance manager,
which applies its decisions (a slot grown, a running worker retired, a pending one deleted)
and keeps them across a master restart."""

from __future__ import annotations

import pytest
from fake_backend import FakeBackend, FakeClock
from test_instance_manager import make, pump, round_trip

from elastic_step.backends.api import EventKind, ExitReason, InstanceEvent, Role
from elastic_step.master.worker_sizing import (
    SizingAction,
    SizingDecision,
    SizingError,
    SizingSettings,
    SizingView,
    create_worker_sizing,
)

WINDOW_S = 10.0
NO_ROOM = "0/1 nodes are available: 1 Insufficient cpu"


class Job:
    """A job whose examples/s at n workers is ``rates[n]``; every tick is one second."""

    def __init__(self, rates: dict[int, float], *, workers: int = 1, max_workers: int = 6):
        self.rates = rates
        self.policy = create_worker_sizing(
            "throughput",
            SizingSettings(
                workers=workers, max_workers=max_workers, window_s=WINDOW_S, pending_s=30.0
            ),
        )
        self.now, self.records, self.wanted = 0.0, 0.0, workers
        self.decisions: list[SizingDecision] = []

    def run(self, seconds: int, *, pending_for: float = 0.0) -> list[SizingDecision]:
        made = []
        for _ in range(seconds):
            self.now += 1
            self.records += self.rates[self.wanted]
            view = SizingView(
                elapsed_s=self.now,
                wanted=self.wanted,
                running=self.wanted - (1 if pending_for else 0),
                stable_for_s=self.now,
                all_worked=True,
                pending_for_s=pending_for,
                pending_message="0/1 nodes are available: 1 Insufficient cpu"
                if pending_for
                else "",
                records_trained=int(self.records),
            )
            decision = self.policy.decide(view)
            if decision is not None:
                self.wanted = decision.workers_to
                made.append(decision)
        self.decisions += made
        return made


def test_it_grows_while_a_worker_pays_and_gives_back_the_first_that_does_not() -> None:
    job = Job({1: 100.0, 2: 200.0, 3: 210.0, 4: 220.0})  # a source that serves two readers
    job.run(200)
    assert [(d.action, d.workers_from, d.workers_to) for d in job.decisions] == [
        (SizingAction.GROW, 1, 2),
        (SizingAction.GROW, 2, 3),
        (SizingAction.SHRINK, 3, 2),
    ]
    first, second, back = job.decisions
    assert first.examples_per_s == pytest.approx(100, rel=0.02) and first.gain is None
    assert second.gain == pytest.approx(1.0, rel=0.05)
    assert back.gain == pytest.approx(0.1, abs=0.03)  # 10 examples/s of a share of 100
    assert (back.examples_per_s, back.previous_examples_per_s) == pytest.approx((210, 200), 0.02)
    assert "below --auto-workers-gain=0.5; giving it back and settling at 2" in back.reason
    assert job.wanted == 2 and not job.run(1000)  # settled: it stays


def test_a_job_that_scales_grows_to_max_workers_and_settles_there() -> None:
    job = Job({n: 100.0 * n for n in range(1, 5)}, max_workers=4)
    job.run(200)
    assert [d.action for d in job.decisions] == [SizingAction.GROW] * 3 + [SizingAction.SETTLE]
    assert job.wanted == 4 and "settling at --max-workers=4" in job.decisions[-1].reason


def test_a_worker_left_pending_is_given_back_and_asked_for_again_ever_later() -> None:
    job = Job({1: 100.0, 2: 200.0, 3: 300.0})
    [grow] = job.run(11)
    assert (grow.action, job.wanted) == (SizingAction.GROW, 2)
    assert not job.run(29, pending_for=29.0)  # not yet
    [back] = job.run(1, pending_for=30.0)
    assert (back.action, back.workers_to) == (SizingAction.SHRINK, 1)
    assert back.reason.startswith("a worker has waited 30 s to run (0/1 nodes are available")
    assert back.reason.endswith("asking again in 60 s at the earliest")
    assert not job.run(59)  # measured again at 1 worker, but no asking for 60 s
    [again] = job.run(11)
    assert (again.action, again.workers_to) == (SizingAction.GROW, 2)
    assert back.at_s + 60 <= again.at_s <= back.at_s + 60 + WINDOW_S
    [back] = job.run(30, pending_for=30.0)
    assert back.reason.endswith("asking again in 120 s at the earliest")


def test_the_wait_before_asking_again_doubles_up_to_ten_minutes() -> None:
    job = Job({1: 100.0, 2: 200.0})
    for expected in (60, 120, 240, 480, 600, 600):
        for _ in range(1000):  # measured at 1 worker, then asks for a 2nd
            if job.run(1):
                break
        assert job.wanted == 2
        [back] = job.run(30, pending_for=30.0)
        assert back.reason.endswith(f"asking again in {expected} s at the earliest")


def test_a_window_without_training_or_with_a_cold_worker_decides_nothing() -> None:
    policy = create_worker_sizing("throughput", SizingSettings(workers=1, max_workers=3))
    view = dict(wanted=1, running=1, stable_for_s=0, pending_for_s=0, pending_message="")
    for t in range(0, 100):  # training held: no records
        seen = SizingView(elapsed_s=t, all_worked=True, records_trained=50, **view)
        assert policy.decide(seen) is None
    for t in range(100, 200):  # the worker has not finished a task yet
        seen = SizingView(elapsed_s=t, all_worked=False, records_trained=t * 10, **view)
        assert policy.decide(seen) is None


def test_replayed_decisions_bring_a_restarted_masters_policy_where_it_was() -> None:
    settled = Job({1: 100.0, 2: 200.0, 3: 201.0})
    settled.run(100)
    fresh = create_worker_sizing("throughput", settled.policy.settings)
    for decision in settled.decisions:
        fresh.replay(SizingDecision.from_json(round_trip(decision.to_json())))
    assert fresh.settled and fresh.measured == pytest.approx(settled.policy.measured, rel=1e-3)


def test_settings_that_cannot_work_are_refused_naming_the_value() -> None:
    with pytest.raises(SizingError, match=r"min_gain is 1\.5; it must be in"):
        SizingSettings(workers=1, max_workers=2, min_gain=1.5)
    with pytest.raises(SizingError, match=r"max_workers is 1; it must be >= 2"):
        SizingSettings(workers=2, max_workers=1)
    with pytest.raises(SizingError, match="no worker sizing policy 'fastest'"):
        create_worker_sizing("fastest", SizingSettings(workers=1, max_workers=2))


# -- applied by the instance manager --


def auto(backend: FakeBackend, clock: FakeClock, **overrides):
    settings = dict(workers=1, max_workers=3, sizing="throughput", grow_after_s=WINDOW_S)
    manager = make(backend, clock, **{**settings, **overrides})
    manager.reconcile()
    pump(manager)
    return manager


def work(manager, clock: FakeClock, seconds: int, per_worker_s: float) -> None:
    """Every running worker finishes tasks worth ``per_worker_s`` records a second."""
    for _ in range(seconds):
        clock.now += 1
        for instance in manager.live(Role.WORKER):
            if instance.slot in manager.worker_slots:
                manager.note_task_done(instance.name, int(per_worker_s))
        manager.reconcile()
        pump(manager)


def test_the_manager_retires_a_running_worker_that_did_not_pay_without_a_restart() -> None:
    backend, clock = FakeBackend(), FakeClock(100.0)
    manager = auto(backend, clock)
    work(manager, clock, 25, per_worker_s=100)  # 1 worker, then 2: each pays in full
    assert manager.worker_slots == {0, 1, 2}
    # A third worker adds nothing: the rate per worker falls to two thirds.
    work(manager, clock, 25, per_worker_s=200 / 3)
    assert manager.worker_slots == {0, 1}
    [retiring] = [i.name for i in manager.live(Role.WORKER) if manager.is_retiring(i.name)]
    assert retiring == "worker-2"
    manager.dismiss(retiring)  # what the coordinator does at its next NextTask
    backend.end(retiring, ExitReason.COMPLETED, 0, "exit status 0")
    pump(manager)
    work(manager, clock, 100, per_worker_s=100)
    assert sorted(backend.live) == ["ps-0", "worker-0", "worker-1"]  # not replaced
    assert manager.restarts["worker"] == 0
    actions = [d["action"] for d in manager.sizing.decisions]
    assert actions == ["grow", "grow", "shrink"]

    # A restarted master has the decisions, and its policy stays settled.
    restarted = make(
        backend, clock, workers=1, max_workers=3, sizing="throughput", grow_after_s=WINDOW_S
    )
    restarted.restore(round_trip(manager.snapshot()))
    restarted.adopt(backend.list_instances())
    assert restarted.sizing.decisions == manager.sizing.decisions
    work(restarted, clock, 100, per_worker_s=100)
    assert restarted.worker_slots == {0, 1} and len(restarted.sizing.decisions) == 3


class FullBackend(FakeBackend):
    """A cluster with room for ``room`` instances: the next ones stay pending."""

    room = 2

    def launch(self, spec) -> None:
        super().launch(spec)
        if len(self.live) > self.room:
            self.events[-1] = InstanceEvent(spec.name, EventKind.PENDING, message=NO_ROOM)


def test_the_manager_deletes_a_worker_left_pending_and_asks_later_in_a_fresh_slot() -> None:
    backend, clock = FullBackend(), FakeClock(100.0)
    manager = auto(backend, clock, max_workers=2)
    work(manager, clock, 11, per_worker_s=100)
    assert manager.worker_slots == {0, 1}
    [pending] = [i for i in manager.live(Role.WORKER) if i.slot == 1]
    assert (pending.name, pending.message) == ("worker-1", NO_ROOM)
    work(manager, clock, 3 * int(WINDOW_S), per_worker_s=100)
    assert manager.worker_slots == {0}
    assert NO_ROOM in manager.sizing.decisions[-1]["reason"]
    assert ("worker-1", 0) in backend.deleted
    assert manager.restarts["worker"] == 0 and "worker-1" not in backend.live
    work(manager, clock, 59, per_worker_s=100)
    assert manager.worker_slots == {0}  # 60 s before it asks again
    work(manager, clock, 12, per_worker_s=100)
    assert manager.worker_slots == {0, 2}  # slot 1 was given back: never reused
    assert backend.names()[-1] == "worker-2"
