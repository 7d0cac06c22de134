"""``all-running``: grow by one worker each time every wanted worker has run for a window,
up to ``max_workers``. A cluster that grants the pods lets the job grow; one that does not
keeps the newest worker pending, and the job waits at the size it has.
Tests: tests/unit/test_instance_manager.py (growth), tests/e2e/test_elasticity.py.
"""

from __future__ import annotations

from elastic_step.master.worker_sizing.api import (
    SizingAction,
    SizingDecision,
    SizingView,
    WorkerSizing,
)


class GrowWhileAllRun(WorkerSizing):
    name = "all-running"

    def decide(self, view: SizingView) -> SizingDecision | None:
        s = self.settings
        if view.wanted >= s.max_workers or view.running < view.wanted:
            return None
        if view.stable_for_s < s.window_s:
            return None
        return SizingDecision(
            action=SizingAction.GROW,
            at_s=view.elapsed_s,
            workers_from=view.wanted,
            workers_to=view.wanted + 1,
            reason=(
                f"all {view.wanted} workers have run for {s.window_s:g} s "
                f"(--max-workers={s.max_workers})"
            ),
        )
