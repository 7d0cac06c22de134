"""``throughput`` (``--auto-workers``): the job sizes itself between ``workers`` and
``max_workers`` from its own examples/s.

At each worker count it measures examples/s over ``window_s``, once every running worker has
finished a task (a new worker's start-up is not counted against it). Then:

- at the first count, or when the last added worker raised examples/s by at least
  ``min_gain`` of one worker's share (the examples/s before it divided by the workers before
  it): one more worker, up to ``max_workers``, where it settles;
- otherwise that worker is given back, and the job settles one below: adding workers has
  stopped paying (a shared data source, the PS, the network);
- a worker asked for that is still pending after ``pending_s`` (the cluster has no room) is
  given back, and the next is asked for no sooner than ``pending_s`` x 2, 4, 8... after, at
  most ``MAX_ASK_AGAIN_S`` after: room that comes later is still found.

Once settled it decides nothing more. Only training records count; a window in which nothing
trained (an evaluation round with training held) decides nothing.
Tests: tests/unit/test_worker_sizing.py, tests/e2e/test_auto_workers.py.
"""

from __future__ import annotations

from elastic_step.master.worker_sizing.api import (
    SizingAction,
    SizingDecision,
    SizingSettings,
    SizingView,
    WorkerSizing,
)

#: The longest wait before asking again for a worker after one was left pending.
MAX_ASK_AGAIN_S = 600.0


def ask_again_after_s(settings: SizingSettings, give_backs: int) -> float:
    """Seconds to wait before asking for a worker again after ``give_backs`` pending ones."""
    return min(settings.pending_s * 2**give_backs, max(MAX_ASK_AGAIN_S, settings.pending_s))


class ThroughputSizing(WorkerSizing):
    name = "throughput"

    def __init__(self, settings: SizingSettings) -> None:
        super().__init__(settings)
        #: examples/s last measured at each worker count.
        self.measured: dict[int, float] = {}
        self.settled = False
        self.give_backs = 0
        self._no_grow_before = 0.0
        #: The window being measured: (worker count, its start, records trained then).
        self._window: tuple[int, float, int] | None = None

    def decide(self, view: SizingView) -> SizingDecision | None:
        if self.settled:
            return None
        if view.running < view.wanted:
            self._window = None
            return self._give_back_pending(view)
        if not view.all_worked:
            self._window = None
            return None
        if self._window is None or self._window[0] != view.wanted:
            self._window = (view.wanted, view.elapsed_s, view.records_trained)
            return None
        count, start, records = self._window
        if view.elapsed_s - start < self.settings.window_s:
            return None
        self._window = (count, view.elapsed_s, view.records_trained)
        rate = (view.records_trained - records) / (view.elapsed_s - start)
        if rate <= 0:
            return None  # nothing trained: no evidence either way
        self.measured[count] = rate
        return self._judge(view, count, rate)

    def _judge(self, view: SizingView, count: int, rate: float) -> SizingDecision | None:
        s = self.settings
        previous = self.measured.get(count - 1) if count > s.workers else None
        gain = None
        figures = f"{rate:.1f} examples/s at {count} workers"
        if previous:
            gain = (rate - previous) / (previous / (count - 1))
            figures = (
                f"worker {count} took examples/s from {previous:.1f} to {rate:.1f}: "
                f"{gain:+.2f} of one worker's share"
            )
            if gain < s.min_gain:
                self.settled = True
                return self._decision(
                    view,
                    SizingAction.SHRINK,
                    count - 1,
                    f"{figures}, below --auto-workers-gain={s.min_gain:g}; giving it back "
                    f"and settling at {count - 1}",
                    rate,
                    previous,
                    gain,
                )
        if count >= s.max_workers:
            self.settled = True
            return self._decision(
                view,
                SizingAction.SETTLE,
                count,
                f"{figures}; settling at --max-workers={s.max_workers}",
                rate,
                previous,
                gain,
            )
        if view.elapsed_s < self._no_grow_before:
            return None  # a worker was given back for want of room: not yet
        enough = f" (at least {s.min_gain:g})" if gain is not None else ""
        return self._decision(
            view,
            SizingAction.GROW,
            count + 1,
            f"{figures}{enough}; trying {count + 1}",
            rate,
            previous,
            gain,
        )

    def _give_back_pending(self, view: SizingView) -> SizingDecision | None:
        s = self.settings
        if view.wanted <= s.workers or view.pending_for_s < s.pending_s:
            return None
        self.give_backs += 1
        wait = ask_again_after_s(s, self.give_backs)
        self._no_grow_before = view.elapsed_s + wait
        return self._decision(
            view,
            SizingAction.SHRINK,
            view.wanted - 1,
            f"a worker has waited {view.pending_for_s:.0f} s to run "
            f"({view.pending_message or 'no reason given'}); giving its slot back, and asking "
            f"again in {wait:.0f} s at the earliest",
        )

    @staticmethod
    def _decision(
        view: SizingView,
        action: SizingAction,
        to: int,
        reason: str,
        rate: float | None = None,
        previous: float | None = None,
        gain: float | None = None,
    ) -> SizingDecision:
        return SizingDecision(
            action=action,
            at_s=view.elapsed_s,
            workers_from=view.wanted,
            workers_to=to,
            reason=reason,
            examples_per_s=None if rate is None else round(rate, 3),
            previous_examples_per_s=None if previous is None else round(previous, 3),
            gain=None if gain is None else round(gain, 4),
        )

    def replay(self, decision: SizingDecision) -> None:
        if decision.examples_per_s is not None:
            self.measured[decision.workers_from] = decision.examples_per_s
        if decision.action is SizingAction.SETTLE or (
            decision.action is SizingAction.SHRINK and decision.gain is not None
        ):
            self.settled = True
        elif decision.action is SizingAction.SHRINK:  # a pending worker given back
            self.give_backs += 1
            wait = ask_again_after_s(self.settings, self.give_backs)
            self._no_grow_before = decision.at_s + wait
