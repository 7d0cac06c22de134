"""What the sizing policy sees and what it decided, kept by the instance manager: the
training records done, the workers that have finished a task, the worker slots waiting for a
running worker and since when, and every decision (durable, with the membership).
Tests: tests/unit/test_worker_sizing.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from elastic_step.master.instances.process_state import ProcessState
from elastic_step.master.worker_sizing.api import SizingDecision, SizingView, WorkerSizing

#: Decisions kept on record; past that the oldest are dropped.
MAX_DECISIONS = 1000


class SizingLedger:
    def __init__(self, policy: WorkerSizing, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        #: Every decision, oldest first, as JSON.
        self.decisions: list[dict] = []
        #: Training records done, and the workers that finished a task, since this master
        #: started: the policy measures differences, so these need not survive a restart.
        self.records_trained = 0
        self._worked: set[str] = set()
        #: Worker slots waiting for a running worker, since when.
        self._waiting_since: dict[int, float] = {}

    def note_task_done(self, name: str, records: int) -> None:
        self.records_trained += records
        self._worked.add(name)

    def note_waiting(self, slot: int) -> None:
        """Worker slot ``slot`` has no running worker (asked for, launched, or one ended)."""
        self._waiting_since.setdefault(slot, self._clock())

    def note_running(self, slot: int) -> None:
        self._waiting_since.pop(slot, None)

    def view(
        self, *, elapsed_s: float, slots: set[int], workers: Iterable, stable_for_s: float
    ) -> SizingView:
        """The view of the wanted ``slots`` and their live ``workers`` (instances)."""
        now = self._clock()
        workers = [i for i in workers if i.slot in slots]
        running = [i for i in workers if i.state is ProcessState.RUNNING]
        waiting = {s: t for s, t in self._waiting_since.items() if s in slots}
        longest = min(waiting, key=waiting.__getitem__, default=None)
        message = next((i.message for i in workers if i.slot == longest and i.message), "")
        return SizingView(
            elapsed_s=elapsed_s,
            wanted=len(slots),
            running=len(running),
            stable_for_s=stable_for_s,
            all_worked=all(i.name in self._worked for i in running),
            pending_for_s=0.0 if longest is None else now - waiting[longest],
            pending_message=message,
            records_trained=self.records_trained,
        )

    def add(self, decision: dict, *, replay: bool = True) -> None:
        """Keeps ``decision``; with ``replay`` (a restarted master's), the policy takes it
        back too."""
        self.decisions.append(dict(decision))
        if len(self.decisions) > MAX_DECISIONS:
            del self.decisions[0]
        if replay:
            self.policy.replay(SizingDecision.from_json(decision))
