"""Splits the data into tasks and tracks them through todo, doing and done.

A training task is a range of records of one training shard for one epoch. Epochs are created
lazily, when the todo queue of the last one runs dry. Evaluation tasks cover the validation
shards; they are grouped in rounds, started every ``evaluation_steps`` model versions and at
the end of each epoch, and run before any waiting training task.

Rules:
- A task is handed out under a lease. A lost task (its worker died, or the lease ran out)
  goes back to todo at once and does not count as a failure.
- A task that fails in user code is retried; past ``max_task_retries`` failures the job fails
  with that error. No task is dropped.
- Each task is counted once, however often it ran: ``records_trained`` per epoch equals the
  number of training records.

The manager is not thread-safe; the master serializes calls to it.
"""

from __future__ import annotations

import enum
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np


class TaskKind(enum.StrEnum):
    TRAIN = "train"
    EVALUATE = "evaluate"


@dataclass
class Task:
    id: int
    kind: TaskKind
    shard: str
    start: int
    end: int
    epoch: int
    #: The evaluation round of an evaluation task.
    round: int | None = None
    failures: int = 0

    @property
    def records(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        return f"{self.kind.value} task {self.id} ({self.shard} records {self.start}-{self.end})"

    def to_json(self) -> dict:
        return {**asdict(self), "kind": self.kind.value}

    @classmethod
    def from_json(cls, d: dict) -> Task:
        return cls(**{**d, "kind": TaskKind(d["kind"])})


@dataclass
class EvaluationResult:
    """What a worker reports for one evaluation task: summed loss and metric states."""

    loss_sum: float
    example_count: int
    #: Each metric's state variables, in the order the metrics define them.
    metric_states: list[np.ndarray]


@dataclass
class EvaluationRound:
    id: int
    model_version: int
    #: Why it ran: "epoch-end" or "steps".
    trigger: str
    epoch: int
    pending: set[int] = field(default_factory=set)
    loss_sum: float = 0.0
    example_count: int = 0
    metric_states: list[np.ndarray] | None = None

    def add(self, result: EvaluationResult) -> None:
        self.loss_sum += result.loss_sum
        self.example_count += result.example_count
        if self.metric_states is None:
            self.metric_states = [np.array(s, dtype=np.float64) for s in result.metric_states]
        else:
            for total, state in zip(self.metric_states, result.metric_states, strict=True):
                total += state

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "model_version": self.model_version,
            "trigger": self.trigger,
            "epoch": self.epoch,
            "pending": sorted(self.pending),
            "loss_sum": self.loss_sum,
            "example_count": self.example_count,
            "metric_states": None
            if self.metric_states is None
            else [s.tolist() for s in self.metric_states],
        }

    @classmethod
    def from_json(cls, d: dict) -> EvaluationRound:
        states = d["metric_states"]
        return cls(
            id=d["id"],
            model_version=d["model_version"],
            trigger=d["trigger"],
            epoch=d["epoch"],
            pending=set(d["pending"]),
            loss_sum=d["loss_sum"],
            example_count=d["example_count"],
            metric_states=None
            if states is None
            else [np.array(s, dtype=np.float64) for s in states],
        )


@dataclass
class _Lease:
    task: Task
    worker: str
    deadline: float


@dataclass(frozen=True)
class TaskSettings:
    """How the data is cut into tasks."""

    #: (shard URI, record count) of the training split.
    train_shards: Sequence[tuple[str, int]]
    #: (shard URI, record count) of the validation split; may be empty.
    validation_shards: Sequence[tuple[str, int]]
    records_per_task: int
    epochs: int
    #: Start an evaluation round every this many model versions; 0 for epoch ends only.
    evaluation_steps: int = 0
    max_task_retries: int = 3
    lease_s: float = 120.0
    seed: int = 0


class TaskManager:
    def __init__(self, settings: TaskSettings, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._train_todo: deque[Task] = deque()
        self._eval_todo: deque[Task] = deque()
        self._doing: dict[int, _Lease] = {}
        self._done: set[int] = set()
        self._next_id = 0
        #: The last epoch whose tasks were created (1-based; 0 before the first).
        self.epochs_created = 0
        self._records_trained: dict[int, int] = {}
        self._rounds: dict[int, EvaluationRound] = {}
        self._next_round = 0
        self._next_eval_version = settings.evaluation_steps
        #: Finished evaluation rounds, oldest first; the master turns them into metrics.
        self.completed_rounds: list[EvaluationRound] = []
        #: Set when a task failed past its retry limit: the job fails with this message.
        self.failure: str | None = None
        self.model_version = 0

    # -- handing out --

    def get_task(self, worker: str) -> Task | None:
        """The next task for ``worker`` under a fresh lease; None when there is none now."""
        if self.failure is not None:
            return None
        if not self._train_todo and self.epochs_created < self.settings.epochs:
            self._create_epoch()
        queue = self._eval_todo or self._train_todo
        if not queue:
            return None
        task = queue.popleft()
        self._doing[task.id] = _Lease(task, worker, self._clock() + self.settings.lease_s)
        return task

    def renew_leases(self, worker: str) -> None:
        deadline = self._clock() + self.settings.lease_s
        for lease in self._doing.values():
            if lease.worker == worker:
                lease.deadline = deadline

    # -- outcomes --

    def report_success(
        self,
        task_id: int,
        *,
        model_version: int = 0,
        evaluation: EvaluationResult | None = None,
    ) -> Task | None:
        """Marks a task done; returns it, or None for a task already done or unknown."""
        lease = self._doing.pop(task_id, None)
        if lease is None or task_id in self._done:
            return None
        task = lease.task
        self._done.add(task_id)
        self.model_version = max(self.model_version, model_version)
        if task.kind is TaskKind.TRAIN:
            self._records_trained[task.epoch] = (
                self._records_trained.get(task.epoch, 0) + task.records
            )
            if self._records_trained[task.epoch] == self.records_per_epoch:
                self._start_round("epoch-end", task.epoch)
        else:
            self._finish_eval_task(task, evaluation)
        # After the epoch-end round, so a version crossing a step boundary adds no second round.
        self.observe_model_version(model_version)
        return task

    def report_failure(self, task_id: int, error: str, worker: str) -> Task | None:
        """Records a user-code failure: the task is retried, or the job fails past the limit.

        A report from a worker that no longer holds the task (its lease ran out and the task
        went to another) is ignored: it must not take the other worker's lease.
        """
        lease = self._doing.get(task_id)
        if lease is None or lease.worker != worker:
            return None
        del self._doing[task_id]
        task = lease.task
        task.failures += 1
        if task.failures > self.settings.max_task_retries:
            self.failure = (
                f"{task.describe()} failed {task.failures} times, more than "
                f"--max-task-retries={self.settings.max_task_retries}; last error: {error}"
            )
        else:
            self._queue_of(task).append(task)
        return task

    def recover_tasks(self, worker: str) -> list[Task]:
        """Puts the tasks of a lost worker back at the front of todo; not a failure."""
        lost = [lease.task for lease in self._doing.values() if lease.worker == worker]
        for task in lost:
            del self._doing[task.id]
            self._queue_of(task).appendleft(task)
        return lost

    def expire_leases(self) -> list[tuple[Task, str]]:
        """Recovers the tasks whose lease ran out; returns them with their worker."""
        now = self._clock()
        expired = [
            (lease.task, lease.worker) for lease in self._doing.values() if lease.deadline < now
        ]
        for task, _ in expired:
            del self._doing[task.id]
            self._queue_of(task).appendleft(task)
        return expired

    def observe_model_version(self, version: int) -> None:
        """Notes the model version; starts an evaluation round every ``evaluation_steps``."""
        self.model_version = max(self.model_version, version)
        steps = self.settings.evaluation_steps
        if steps <= 0 or self.model_version < self._next_eval_version:
            return
        self._next_eval_version = (self.model_version // steps + 1) * steps
        if not self.training_done and not self._rounds:
            self._start_round("steps", self.epochs_created)

    # -- progress --

    @property
    def records_per_epoch(self) -> int:
        return sum(records for _, records in self.settings.train_shards)

    def records_trained(self, epoch: int) -> int:
        return self._records_trained.get(epoch, 0)

    @property
    def current_epoch(self) -> int:
        """The oldest epoch whose training is not complete (the last one when all are)."""
        for epoch in range(1, self.settings.epochs + 1):
            if self.records_trained(epoch) < self.records_per_epoch:
                return epoch
        return self.settings.epochs

    @property
    def training_done(self) -> bool:
        return all(
            self.records_trained(e) == self.records_per_epoch
            for e in range(1, self.settings.epochs + 1)
        )

    @property
    def finished(self) -> bool:
        """All epochs trained and every evaluation round finished."""
        return self.training_done and not self._rounds and not self._eval_todo

    def doing_count(self) -> int:
        return len(self._doing)

    def tasks_of(self, worker: str) -> list[Task]:
        return [lease.task for lease in self._doing.values() if lease.worker == worker]

    def epoch_accounting(self) -> list[dict]:
        return [
            {
                "epoch": e,
                "records_trained": self.records_trained(e),
                "records_expected": self.records_per_epoch,
            }
            for e in range(1, self.settings.epochs + 1)
        ]

    # -- persistence --

    def to_state(self) -> dict:
        """A JSON-ready snapshot. Tasks in doing keep their worker, for adoption on resume."""
        return {
            "train_todo": [t.to_json() for t in self._train_todo],
            "eval_todo": [t.to_json() for t in self._eval_todo],
            "doing": [
                {"task": lease.task.to_json(), "worker": lease.worker}
                for lease in self._doing.values()
            ],
            "done": sorted(self._done),
            "next_id": self._next_id,
            "epochs_created": self.epochs_created,
            "records_trained": {str(k): v for k, v in self._records_trained.items()},
            "rounds": [r.to_json() for r in self._rounds.values()],
            "next_round": self._next_round,
            "next_eval_version": self._next_eval_version,
            "completed_rounds": [r.to_json() for r in self.completed_rounds],
            "failure": self.failure,
            "model_version": self.model_version,
        }

    @classmethod
    def from_state(
        cls, settings: TaskSettings, state: dict, clock: Callable[[], float] = time.monotonic
    ) -> TaskManager:
        """Rebuilds a manager; tasks that were in doing get fresh leases for the same worker."""
        manager = cls(settings, clock)
        manager._train_todo = deque(Task.from_json(t) for t in state["train_todo"])
        manager._eval_todo = deque(Task.from_json(t) for t in state["eval_todo"])
        deadline = clock() + settings.lease_s
        for entry in state["doing"]:
            task = Task.from_json(entry["task"])
            manager._doing[task.id] = _Lease(task, entry["worker"], deadline)
        manager._done = set(state["done"])
        manager._next_id = state["next_id"]
        manager.epochs_created = state["epochs_created"]
        manager._records_trained = {int(k): v for k, v in state["records_trained"].items()}
        manager._rounds = {r["id"]: EvaluationRound.from_json(r) for r in state["rounds"]}
        manager._next_round = state["next_round"]
        manager._next_eval_version = state["next_eval_version"]
        manager.completed_rounds = [EvaluationRound.from_json(r) for r in state["completed_rounds"]]
        manager.failure = state["failure"]
        manager.model_version = state["model_version"]
        return manager

    # -- internals --

    def _queue_of(self, task: Task) -> deque[Task]:
        return self._train_todo if task.kind is TaskKind.TRAIN else self._eval_todo

    def _split(self, shards: Sequence[tuple[str, int]], kind: TaskKind, epoch: int, round_id=None):
        step = self.settings.records_per_task
        tasks = []
        for shard, records in shards:
            for start in range(0, records, step):
                tasks.append(
                    Task(
                        self._next_id,
                        kind,
                        shard,
                        start,
                        min(start + step, records),
                        epoch,
                        round_id,
                    )
                )
                self._next_id += 1
        return tasks

    def _create_epoch(self) -> None:
        self.epochs_created += 1
        tasks = self._split(self.settings.train_shards, TaskKind.TRAIN, self.epochs_created)
        random.Random(self.settings.seed * 1_000_003 + self.epochs_created).shuffle(tasks)
        self._train_todo.extend(tasks)

    def _start_round(self, trigger: str, epoch: int) -> None:
        if not self.settings.validation_shards:
            return
        round_ = EvaluationRound(self._next_round, self.model_version, trigger, epoch)
        self._next_round += 1
        tasks = self._split(self.settings.validation_shards, TaskKind.EVALUATE, epoch, round_.id)
        round_.pending = {t.id for t in tasks}
        self._rounds[round_.id] = round_
        self._eval_todo.extend(tasks)

    def _finish_eval_task(self, task: Task, result: EvaluationResult | None) -> None:
        round_ = self._rounds.get(task.round)
        if round_ is None:
            return
        if result is not None:
            round_.add(result)
        round_.pending.discard(task.id)
        if not round_.pending:
            del self._rounds[round_.id]
            self.completed_rounds.append(round_)
