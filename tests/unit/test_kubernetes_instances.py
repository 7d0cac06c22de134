"""How the Kubernetes backend's InstanceTracker turns versions of pods into the master's
events, with no cluster: forward only, one end per instance, what a relist missed."""

from __future__ import annotations

import time

import pytest

from elastic_step.backends.api import BackendError, EventKind, ExitReason, LaunchSpec, Role
from elastic_step.backends.kubernetes_instances import InstanceTracker, PodInstance


class Tracked:
    def __init__(self, terminating_timeout_s: float = 60.0) -> None:
        self.ended: list[str] = []
        self.done_pods: list[tuple[str, str | None]] = []
        self.tracker = InstanceTracker(
            terminating_timeout_s,
            on_end=lambda instance: self.ended.append(instance.name),
            on_done_pod=lambda name, uid: self.done_pods.append((name, uid)),
        )

    def events(self) -> list[tuple[str, EventKind, ExitReason | None]]:
        return [(e.name, e.kind, e.reason) for e in self.tracker.next_events(0.0)]


def spec(name: str = "worker-0") -> LaunchSpec:
    return LaunchSpec(name=name, role=Role.WORKER, index=0, command=["true"])


def pod(
    phase: str,
    *,
    name: str = "worker-0",
    uid: str = "u1",
    main: dict | None = None,
    sidecar: bool = False,
    deleting: bool = False,
    conditions: list[dict] | None = None,
) -> dict:
    statuses = [{"name": "main", "state": main or {"running": {}}}]
    if sidecar:
        statuses.append({"name": "proxy", "state": {"running": {}}})
    metadata: dict = {
        "name": f"job-{name}",
        "uid": uid,
        "labels": {
            "elastic-step/instance": name,
            "elastic-step/role": "worker",
            "elastic-step/index": "0",
        },
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        metadata["deletionGracePeriodSeconds"] = 0
    status = {"phase": phase, "containerStatuses": statuses, "conditions": conditions or []}
    return {"metadata": metadata, "status": status}


def launched(tracked: Tracked, uid: str = "u1") -> PodInstance:
    instance = tracked.tracker.new(spec(), "job-worker-0")
    assert instance is not None
    tracked.tracker.made(instance, pod("Pending", uid=uid), time.monotonic())
    return instance


def test_a_launch_is_idempotent_and_a_name_is_never_reused() -> None:
    tracked = Tracked()
    instance = launched(tracked)
    assert tracked.tracker.new(spec(), "job-worker-0") is None
    tracked.tracker.end(instance, ExitReason.CRASHED, 1, "failed")
    with pytest.raises(BackendError, match="instance name worker-0 was used before"):
        tracked.tracker.new(spec(), "job-worker-0")


def test_versions_move_an_instance_forward_only_and_it_ends_once() -> None:
    tracked = Tracked()
    launched(tracked)
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/3 nodes are available",
    }
    tracked.tracker.on_watch_event("MODIFIED", pod("Pending", conditions=[unschedulable]))
    tracked.tracker.on_watch_event("MODIFIED", pod("Running"))
    tracked.tracker.on_watch_event("MODIFIED", pod("Pending"))  # late: no step back
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    tracked.tracker.on_watch_event("MODIFIED", pod("Succeeded", main=done))
    tracked.tracker.on_watch_event("DELETED", pod("Succeeded", main=done))
    assert tracked.events() == [
        ("worker-0", EventKind.PENDING, None),
        ("worker-0", EventKind.STARTED, None),
        ("worker-0", EventKind.EXITED, ExitReason.COMPLETED),
    ]
    assert tracked.ended == ["worker-0"]


def test_a_pod_whose_container_is_done_but_a_sidecar_runs_on_is_deleted_too() -> None:
    tracked = Tracked()
    launched(tracked)
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    tracked.tracker.on_watch_event("MODIFIED", pod("Running", main=done, sidecar=True))
    assert tracked.events()[-1] == ("worker-0", EventKind.EXITED, ExitReason.COMPLETED)
    assert tracked.done_pods == [("job-worker-0", "u1")]


def test_a_version_of_another_pod_with_the_same_name_is_ignored() -> None:
    tracked = Tracked()
    launched(tracked, uid="u1")
    tracked.tracker.on_watch_event("DELETED", pod("Running", uid="other"))
    assert tracked.events() == []


def test_a_relist_returns_what_it_should_have_shown_and_did_not() -> None:
    tracked = Tracked()
    instance = launched(tracked)
    assert tracked.tracker.on_list({}, sent_at=time.monotonic()) == [instance]
    assert tracked.tracker.on_list({"job-worker-0": pod("Running")}, time.monotonic()) == []


def test_a_list_adopts_live_pods_as_running_and_skips_ended_ones() -> None:
    tracked = Tracked()
    listed = [
        pod("Running", name="worker-0", uid="a"),
        pod("Succeeded", name="worker-1", uid="b"),
        {"metadata": {"name": "stray", "uid": "c", "labels": {}}, "status": {}},
    ]
    live = tracked.tracker.listed(listed, time.monotonic())
    assert [info.name for info in live] == ["worker-0"]
    assert tracked.events() == []  # an adopted running instance gets no STARTED


def test_a_pod_stuck_terminating_past_its_grace_period_is_lost() -> None:
    tracked = Tracked(terminating_timeout_s=0.0)
    instance = launched(tracked)
    assert tracked.tracker.request_delete("worker-0", 1.0) is instance
    assert tracked.tracker.request_delete("worker-0", 1.0) is None  # under way
    tracked.tracker.on_watch_event("MODIFIED", pod("Running", deleting=True))
    time.sleep(0.01)
    events = tracked.tracker.next_events(0.0)
    assert [(e.kind, e.reason) for e in events] == [
        (EventKind.STARTED, None),
        (EventKind.EXITED, ExitReason.LOST),
    ]
    assert "stuck Terminating 0 s past its grace period (deleted by the master" in (
        events[1].message
    )
