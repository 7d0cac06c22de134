"""What the instance room shares with the rest of the master: one worker or PS instance as the
master keeps it, the settings of the membership, and how a launch spec is made for a slot.
The instance manager (:mod:`.instance_manager`) keeps the members; the states an instance
goes through are :mod:`.process_state`'s table.
Tests: tests/unit/test_instance_manager.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elastic_step.backends.api import LaunchSpec, Role
from elastic_step.master.instances.process_state import ProcessState
from elastic_step.master.worker_sizing import SizingSettings, WorkerSizing, create_worker_sizing

#: A worker asked for by the sizing policy is given back after this many windows pending.
PENDING_WINDOWS = 3


@dataclass
class Instance:
    name: str
    role: Role
    #: The slot: worker slot number, or PS shard index.
    slot: int
    state: ProcessState = ProcessState.PENDING
    pid: int | None = None
    exit_code: int | None = None
    #: How it ended (an :class:`ExitReason` value), and the detail.
    reason: str = ""
    message: str = ""

    def describe_end(self) -> str:
        return f"{self.name} {self.reason or self.state.value} ({self.message or 'no detail'})"

    def to_json(self) -> dict:
        # Written out, not dataclasses.asdict: snapshots of 1,000 workers are built under the
        # coordinator's lock, and asdict's deep copies made that 20x slower.
        return {
            "name": self.name,
            "role": self.role.value,
            "slot": self.slot,
            "state": self.state.value,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "message": self.message,
        }

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
    #: The worker sizing policy ("all-running", or "throughput" for --auto-workers), and the
    #: gain an added worker must bring under "throughput".
    sizing: str = "all-running"
    min_gain: float = 0.5
    #: First delay before relaunching a slot whose instance failed before finishing a task;
    #: it doubles with each such failure in a row, up to ``backoff_max_s``.
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    #: How long the job may go without a running worker, or with a PS shard not running
    #: (pending, relaunching, refused by the platform), before it fails: no endless wait.
    starve_timeout_s: float = 300.0
    #: Worker processes kept ready to take a dead worker's slot (see instance_manager's
    #: docstring).
    standby: int = 0

    def sizing_policy(self) -> WorkerSizing:
        return create_worker_sizing(
            self.sizing,
            SizingSettings(
                workers=self.workers,
                max_workers=self.max_workers,
                window_s=self.grow_after_s,
                min_gain=self.min_gain,
                pending_s=PENDING_WINDOWS * self.grow_after_s,
            ),
        )


SpecFactory = Callable[[Role, int, str], LaunchSpec]
