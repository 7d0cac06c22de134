"""What the task room shares with the rest of the master: the kinds of task, a task, the
settings that cut the data into tasks, an evaluation round and its result, and the errors a
report can raise. The task manager (:mod:`.task_manager`) hands tasks out and takes reports.
Tests: tests/unit/test_task_manager.py.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class TaskKind(enum.StrEnum):
    TRAIN = "train"
    EVALUATE = "evaluate"
    PREDICT = "predict"


class InvalidReportError(ValueError):
    """A success report that cannot be right; its task was taken back and re-queued."""


@dataclass(frozen=True)
class Task:
    """A range of records of one shard, built from its id."""

    id: int
    kind: TaskKind
    shard: str
    start: int
    end: int
    #: The epoch a training task belongs to; the epoch an evaluation round followed.
    epoch: int
    #: The evaluation round of an evaluation task.
    round: int | None = None
    #: The lease it is held under, None when nobody holds it.
    lease_id: int | None = None
    #: How each failure so far happened, oldest first.
    failures: tuple[str, ...] = ()
    #: The position of record ``start`` in its split (the split's shards in order).
    first_index: int = 0
    #: A training task whose [start, end) are positions in the training split's permutation
    #: for its epoch (TaskSettings.permuted_training_tasks); its shard is "".
    permuted: bool = False

    @property
    def records(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        if self.permuted:
            where = (
                f"positions {self.start}-{self.end} of the training split's epoch-{self.epoch} "
                "permutation"
            )
        else:
            where = f"{self.shard} records {self.start}-{self.end}"
        return f"{self.kind.value} task {self.id} ({where})"


@dataclass(frozen=True)
class TaskSettings:
    """How the data is cut into tasks, and the limits on running them."""

    #: (shard URI, record count) of the training split; at least one record in all.
    train_shards: Sequence[tuple[str, int]]
    #: (shard URI, record count) of the validation split; may be empty (no evaluation).
    validation_shards: Sequence[tuple[str, int]]
    records_per_task: int
    epochs: int
    #: Start an evaluation round every this many model versions; 0 for epoch ends only.
    evaluation_steps: int = 0
    #: A task may fail this many times; one more failure fails the job.
    max_task_retries: int = 3
    #: A lease runs out this long after its hand-out or its last progress.
    task_timeout_s: float = 120.0
    seed: int = 0
    #: The shape of each metric state an evaluation report must carry; None: whatever the
    #: first report of a round carries.
    metric_shapes: tuple[tuple[int, ...], ...] | None = None
    #: Run each evaluation round with no training task out (see task_manager's Order).
    pause_training_while_evaluating: bool = False
    #: The kind of the tasks of ``train_shards``: TRAIN, or PREDICT for a prediction job
    #: (one epoch, no validation split).
    task_kind: TaskKind = TaskKind.TRAIN
    #: Training tasks are ranges of the training split's permutation for their epoch (its
    #: shards joined in order), not of a shard (task_size.permuted_training_tasks). Not for a
    #: prediction job.
    permuted_training_tasks: bool = False

    def __post_init__(self) -> None:
        for name, least in (
            ("records_per_task", 1),
            ("epochs", 1),
            ("evaluation_steps", 0),
            ("max_task_retries", 0),
        ):
            value = getattr(self, name)
            if value < least:
                raise ValueError(f"{name} is {value}; it must be at least {least}")
        if not (math.isfinite(self.task_timeout_s) and self.task_timeout_s > 0):
            raise ValueError(
                f"task_timeout_s is {self.task_timeout_s}; it must be a positive number of seconds"
            )
        for split, shards in (
            ("training", self.train_shards),
            ("validation", self.validation_shards),
        ):
            for uri, records in shards:
                if records < 0:
                    raise ValueError(
                        f"{split} shard {uri} has {records} records; a count must be at least 0"
                    )
        if not any(records for _, records in self.train_shards):
            raise ValueError(
                f"the training split has no records ({len(self.train_shards)} shards, all "
                "empty): there is nothing to train"
            )
        if self.task_kind is TaskKind.EVALUATE:
            raise ValueError("task_kind is evaluate; it must be train or predict")
        if self.task_kind is TaskKind.PREDICT and (self.epochs != 1 or self.validation_shards):
            raise ValueError(
                f"a prediction job has one epoch and no validation split, got epochs="
                f"{self.epochs} and {len(self.validation_shards)} validation shards"
            )
        if self.task_kind is TaskKind.PREDICT and self.permuted_training_tasks:
            raise ValueError(
                "permuted_training_tasks is set for a prediction job; its tasks must be ranges "
                "(a prediction's row index is its record's place in the split)"
            )
        if self.metric_shapes is not None:
            shapes = tuple(tuple(int(d) for d in shape) for shape in self.metric_shapes)
            if any(d < 0 for shape in shapes for d in shape):
                raise ValueError(f"metric_shapes is {shapes}; dimensions must be at least 0")
            object.__setattr__(self, "metric_shapes", shapes)


class ResultError(ValueError):
    """An evaluation result that cannot be right for its round; the message says why."""


@dataclass
class EvaluationResult:
    """What a worker reports for one evaluation task: summed loss and metric states."""

    loss_sum: float
    example_count: int
    #: Each metric's state variables, in the order the metrics define them.
    metric_states: list[np.ndarray]


@dataclass
class EvaluationRound:
    """One evaluation over the whole validation split, summed over its tasks."""

    id: int
    #: Why it ran: "epoch-end" or "steps".
    trigger: str
    epoch: int
    #: The highest and lowest model version its tasks reported; None before the first report.
    model_version: int | None = None
    min_model_version: int | None = None
    loss_sum: float = 0.0
    example_count: int = 0
    metric_states: list[np.ndarray] | None = None

    def add(
        self, loss_sum: float, example_count: int, states: list[np.ndarray], version: int
    ) -> None:
        """Adds one task's result, reported at model ``version``."""
        self.loss_sum += loss_sum
        self.example_count += example_count
        if self.metric_states is None:
            self.metric_states = [np.array(s, dtype=np.float64) for s in states]
        else:
            for total, state in zip(self.metric_states, states, strict=True):
                total += state
        self.model_version = (
            version if self.model_version is None else max(self.model_version, version)
        )
        self.min_model_version = (
            version if self.min_model_version is None else min(self.min_model_version, version)
        )

    def to_json(self) -> dict:
        states = self.metric_states
        return {
            "id": self.id,
            "trigger": self.trigger,
            "epoch": self.epoch,
            "model_version": self.model_version,
            "min_model_version": self.min_model_version,
            "loss_sum": self.loss_sum,
            "example_count": self.example_count,
            "metric_states": None if states is None else encode_states(states),
        }

    @classmethod
    def from_json(cls, d: dict) -> EvaluationRound:
        states = d["metric_states"]
        return cls(
            id=d["id"],
            trigger=d["trigger"],
            epoch=d["epoch"],
            model_version=d["model_version"],
            min_model_version=d["min_model_version"],
            loss_sum=d["loss_sum"],
            example_count=d["example_count"],
            metric_states=None if states is None else decode_states(states),
        )


def encode_states(states: Sequence[np.ndarray]) -> list[dict]:
    # Shape kept apart from the values: tolist() loses it for shapes with a 0 in them.
    return [{"shape": list(s.shape), "values": s.ravel().tolist()} for s in states]


def decode_states(encoded: list[dict]) -> list[np.ndarray]:
    return [np.array(s["values"], dtype=np.float64).reshape(s["shape"]) for s in encoded]
