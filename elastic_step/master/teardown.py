"""How a job's end takes its workers and PS down: every instance deleted, then backend
events applied until none is live or a bound has passed (nothing waits forever). Tests:
tests/e2e/test_master_and_standby.py (a stopped run) and tests/k8s/ (no pod left)."""

from __future__ import annotations

import time

from elastic_step.backends.api import Backend, Role
from elastic_step.master.job_state.coordinator import Coordinator

#: Seconds a deleted instance has to exit before it is killed.
STOP_GRACE_S = 3.0
#: Seconds the master waits for the backend's events at a time (its loop's tick, too).
TICK_S = 0.2


def wait_until_gone(coordinator: Coordinator, backend: Backend, wait_s: float) -> None:
    """Applies backend events until no worker, standby or PS is live, or ``wait_s`` has
    passed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with coordinator.lock:
            instances = coordinator.instances
            if not any(instances.live(role) for role in Role):
                return
        coordinator.apply_events(backend.next_events(TICK_S))


def stop_all(coordinator: Coordinator, backend: Backend, wait_s: float) -> None:
    """Deletes every instance and waits up to ``wait_s`` for them to be gone."""
    with coordinator.lock:
        coordinator.instances.delete_all(STOP_GRACE_S)
    wait_until_gone(coordinator, backend, wait_s)
