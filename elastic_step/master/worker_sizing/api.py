"""How many workers the job wants: the sizing policy the instance manager asks at each tick.

The instance manager keeps one worker slot per wanted worker. At every reconcile it shows the
policy a :class:`SizingView` of the membership and the work done, and applies the
:class:`SizingDecision` it gets back, if any:

- ``GROW``: one more slot (up to ``max_workers``);
- ``SHRINK``: the newest slot is given back. A worker still pending there is deleted; a running
  one finishes the task in hand, is told the job is over for it, and exits 0. Its tasks are
  never lost: what it holds goes back to the queue as for any worker that ends;
- ``SETTLE``: no change, and none again; said once, so that the log and the summary say why.

Decisions are journaled with the membership and replayed into the policy after a master
restart (:meth:`WorkerSizing.replay`), so a resumed job neither repeats a trial nor forgets
where it settled. Implementations: ``all-running`` (grow while every worker runs) and
``throughput`` (``--auto-workers``: grow while an added worker pays).
Tests: tests/unit/test_worker_sizing.py, tests/e2e/test_auto_workers.py.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass


class SizingError(ValueError):
    """Sizing settings that cannot work (the message names the value and the rule)."""


class SizingAction(enum.StrEnum):
    GROW = "grow"
    SHRINK = "shrink"
    SETTLE = "settle"


@dataclass(frozen=True, kw_only=True)
class SizingSettings:
    #: Bounds: the job starts at ``workers`` and never leaves [workers, max_workers].
    workers: int
    max_workers: int
    #: all-running: grow once every wanted worker has run this long. throughput: measure
    #: examples/s over this long, once every worker has finished a task at the current count.
    window_s: float = 10.0
    #: throughput: an added worker must raise examples/s by at least this fraction of one
    #: worker's share (examples/s before it, divided by the workers before it).
    min_gain: float = 0.5
    #: throughput: a worker asked for that is still pending after this long is given back,
    #: and the next one is asked for only after ``pending_s`` doubled at each such give-back.
    pending_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_workers < self.workers:
            raise SizingError(f"max_workers is {self.max_workers}; it must be >= {self.workers}")
        if self.window_s <= 0 or self.pending_s <= 0:
            raise SizingError(
                f"window_s ({self.window_s}) and pending_s ({self.pending_s}) must be > 0"
            )
        if not 0 < self.min_gain <= 1:
            raise SizingError(f"min_gain is {self.min_gain}; it must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class SizingView:
    """The membership and the work done, as the instance manager sees them at a tick."""

    #: The job's clock (seconds since it first started).
    elapsed_s: float
    #: Worker slots wanted now.
    wanted: int
    #: Workers running in those slots.
    running: int
    #: Seconds since the last change of membership (a start, an end, a resize).
    stable_for_s: float
    #: Every running worker has finished a task since it started (warmed up).
    all_worked: bool
    #: The longest any wanted worker has been waiting to run (0: none waits).
    pending_for_s: float
    #: Why the longest-waiting one waits, as the platform says.
    pending_message: str
    #: Training records done since the job began (a counter that only grows).
    records_trained: int


@dataclass(frozen=True, kw_only=True)
class SizingDecision:
    action: SizingAction
    at_s: float
    workers_from: int
    workers_to: int
    reason: str
    #: examples/s measured at ``workers_from``, and at one worker fewer (throughput only).
    examples_per_s: float | None = None
    previous_examples_per_s: float | None = None
    #: What the last added worker raised examples/s by, in one worker's share.
    gain: float | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "action": self.action.value}

    @classmethod
    def from_json(cls, d: dict) -> SizingDecision:
        return cls(**{**d, "action": SizingAction(d["action"])})


class WorkerSizing(ABC):
    """Decides the wanted worker count, one step at a time."""

    name: str

    def __init__(self, settings: SizingSettings) -> None:
        self.settings = settings

    @abstractmethod
    def decide(self, view: SizingView) -> SizingDecision | None:
        """The decision this tick calls for, or None. Called once per reconcile; a decision
        returned is applied at once, so the next view shows it."""

    def replay(self, decision: SizingDecision) -> None:  # noqa: B027 (stateless by default)
        """Takes back a decision made before a master restart, in order."""
