"""A worker's training and evaluation against the PS, one window of up to K steps at a time.

Before a window the worker holds the PS's dense values and the table rows of the window's
ids (found by :meth:`ModelParameters.batch_rows`). With K = 1 it computes the batch's
gradients and pushes them; the PS applies its optimizer. With K > 1 it runs K steps of its
own optimizer on its copy and pushes the change, negated (a pseudo-gradient), which the PS
applies with the outer optimizer; the window's table rows first take what their momentum
would still move them by (``Steps.flush``), since the copy is replaced after the push.
Each push also carries the next window's ids and is answered with the dense values and the
rows of those ids: one round trip per shard per window. A task's first window pulls only its
rows (nothing for a model without tables): the dense values came with the last push. A window
never spans tasks, so a task is reported only after its last push: a worker that dies loses
at most one window, and its task is re-queued. ``train`` returns the task's mean training
loss and the model's metrics on the same batches, which the worker reports with the task.
``train_queued`` does the same for a model without tables with K > 1, a window per compiled
call (``Steps.run_window``) that reads its batches from the input pipeline's iterator;
``evaluate_queued`` evaluates that way, for a model without tables and any K.
Tests: tests/unit/test_model_parameters.py.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from elastic_step.model.definition import batch_size_of
from elastic_step.model.parameters import ModelParameters
from elastic_step.rpc.ps_client import PSClient, PSUnavailableError, Rows
from elastic_step.user_errors import plain_message
from elastic_step.worker.steps import Steps

log = logging.getLogger("elastic_step.worker")

#: Evaluation batches per compiled call: the task's progress (which renews its lease) moves on
#: between calls.
EVALUATION_STEPS_PER_CALL = 32


class UserCodeError(Exception):
    """The model definition's code failed while running a task."""

    @classmethod
    def of(cls, what: str, error: Exception) -> UserCodeError:
        """``what failed: ValueError: ...``, on one line: a compiled step's error message
        names the frames of the trace, which the worker's log keeps (its cause)."""
        return cls(f"{what} failed: {type(error).__name__}: {plain_message(error)}")


@dataclass
class TaskLoss:
    """A task's loss: summed over its examples (each batch's mean loss times its size), so
    that batches of different sizes weigh by their examples; for training, the model's
    metrics over the same batches, by name (see :meth:`Steps.metric_results`)."""

    loss_sum: float = 0.0
    examples: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, loss: float, examples: int) -> None:
        self.loss_sum += loss * examples
        self.examples += examples

    def add_summed(self, loss_sum: float, examples: int) -> None:
        """Adds batches whose losses are already summed (a compiled window's)."""
        self.loss_sum += loss_sum
        self.examples += examples

    @property
    def mean(self) -> float:
        return self.loss_sum / self.examples if self.examples else math.nan


class PSConnection(Protocol):
    """The worker's current PS client, and how to get a new one when the PS moves."""

    ps: PSClient

    def connect_ps(self) -> None: ...


class WindowTrainer:
    def __init__(
        self,
        parameters: ModelParameters,
        steps: Steps,
        local_steps: int,
        connection: PSConnection,
        on_step: Callable[[], None] = lambda: None,
    ) -> None:
        self.parameters = parameters
        self.steps = steps
        self.local_steps = local_steps
        self._connection = connection
        self._on_step = on_step
        #: The trainable dense values last taken from the PS (what the copy's change is
        #: measured from with K > 1); None before the first pull.
        self._base: dict[str, np.ndarray] | None = None
        self._held: tuple[dict, dict] = ({}, {})

    def train(self, batches: Iterable[tuple]) -> TaskLoss:
        """Trains on ``batches`` (a task's), a window of up to K steps per round trip;
        returns their training loss and metrics."""
        loss = TaskLoss()
        batches = iter(batches)
        window, ids = self._window(batches)
        if not window:
            return loss
        self._metrics(self.steps.reset_metrics)
        if self._base is None or ids:
            self._pull(ids, dense=self._base is None)
        while window:
            dense, rows = self._run_window(window, ids, loss)
            window, next_ids = self._window(batches)
            self._push(dense, rows, next_ids)
            ids = next_ids
        loss.metrics = self._metrics(self.steps.metric_results)
        return loss

    def train_queued(self, iterator, batches: int) -> TaskLoss:
        """Trains a task whose ``batches`` batches wait in ``iterator``, a window of K steps
        per compiled call (``Steps.run_window``, which must apply); as :meth:`train`.
        The caller checks that the examples add up to the task's records."""
        loss = TaskLoss()
        if batches == 0:
            return loss
        if self._base is None:
            self._pull({}, dense=True)
        for start in range(0, batches, self.local_steps):
            steps = min(self.local_steps, batches - start)
            try:
                result = self.steps.run_window(iterator, steps, reset_metrics=start == 0)
            except Exception as e:
                raise UserCodeError.of("the training step", e) from e
            loss.add_summed(result.loss_sum, result.examples)
            loss.metrics = result.metrics
            for _ in range(steps):
                self._on_step()
            self._push({n: self._base[n] - v for n, v in result.dense.items()}, {}, {})
        return loss

    def evaluate_queued(
        self, iterator, batches: int, on_batches: Callable[[int], None]
    ) -> TaskLoss:
        """Evaluates, on the PS's current values, a task whose ``batches`` batches wait in
        ``iterator``: up to ``EVALUATION_STEPS_PER_CALL`` batches per compiled call
        (``Steps.run_evaluation``, which must apply), ``on_batches`` told after each call
        how many it took. The batches are added to the model's metrics, which the caller
        resets before and reads after. The caller checks the examples, as for
        :meth:`train_queued`."""
        loss = TaskLoss()
        self._pull({}, dense=True)
        for start in range(0, batches, EVALUATION_STEPS_PER_CALL):
            steps = min(EVALUATION_STEPS_PER_CALL, batches - start)
            try:
                loss.add_summed(*self.steps.run_evaluation(iterator, steps))
            except Exception as e:
                raise UserCodeError.of("evaluation", e) from e
            on_batches(steps)
        return loss

    def evaluation_batches(self, batches: Iterable[tuple]) -> Iterator[tuple]:
        """Yields ``batches`` each once the worker holds the values it reads."""
        first = True
        for features, labels in batches:
            ids = self.parameters.layout.split_ids(self._rows(features))
            if first or ids:
                self._pull(ids, dense=first)
            first = False
            yield features, labels

    # -- internals --

    def _metrics(self, call: Callable):
        """Resets or reads the metrics: the user's code, as the step is."""
        try:
            return call()
        except Exception as e:
            raise UserCodeError.of("a metric", e) from e

    def _rows(self, features) -> list[np.ndarray]:
        """The rows ``features`` read, each group's (ModelParameters.batch_rows)."""
        try:
            return self.parameters.batch_rows(features)
        except Exception as e:
            raise UserCodeError.of("the model", e) from e

    def _window(self, batches: Iterator[tuple]) -> tuple[list, dict[str, np.ndarray]]:
        """The next up to K batches, and the row ids they read by table (sorted, unique)."""
        window, rows = [], []
        for features, labels in batches:
            window.append((features, labels))
            rows.append(self._rows(features))
            if len(window) == self.local_steps:
                break
        if not rows or not rows[0]:
            return window, {}
        # A group at a time: a model can have dozens of tables (model/table_rows.py).
        joined = [np.unique(np.concatenate(group)) for group in zip(*rows, strict=True)]
        return window, self.parameters.layout.split_ids(joined)

    def _run_window(self, window: list, ids: dict, loss: TaskLoss) -> tuple[dict, Rows]:
        """Runs the window's steps, adding their losses to ``loss``; its update: the gradients
        (K = 1), or the negated change of the worker's copy since the values last pulled
        (K > 1)."""
        try:
            if self.local_steps == 1:
                ((features, labels),) = window
                value, dense, rows = self.steps.gradients(features, labels)
                loss.add(value, batch_size_of(labels, features))
                self._on_step()
                return dense, rows
            held_ids, held_rows = self._held if ids else ({}, {})
            rows = self.steps.window_rows(held_ids, held_rows)
            for features, labels in window:
                step_loss = self.steps.local(features, labels, rows)
                loss.add(step_loss, batch_size_of(labels, features))
                self._on_step()
            self.steps.flush(rows)
        except Exception as e:
            raise UserCodeError.of("the training step", e) from e
        dense = {n: self._base[n] - v.numpy() for n, v in self.parameters.dense.items()}
        return dense, rows.change()

    def pull_all(self) -> None:
        """Takes every value the PS holds, every row of every table included (the model
        save), reconnecting while the PS is away."""
        tables = self.parameters.table_specs()
        self._pull({n: np.arange(spec.rows) for n, spec in tables.items()}, dense=True)
        self._held = ({}, {})  # every row: no window starts from them

    def _pull(self, ids: dict[str, np.ndarray], dense: bool) -> None:
        """Takes the dense values (if ``dense``) and the rows ``ids``, reconnecting while the
        PS is away."""
        values, rows = self._on_ps(lambda ps: ps.pull(ids, dense))
        self._take(values, ids, rows)

    def _push(self, dense: dict, rows: Rows, ids: dict) -> None:
        """Pushes a window's update and takes the dense values and the next window's rows,
        pushing again after a reconnect."""
        state = self.parameters.state_values()
        values, pulled = self._on_ps(lambda ps: ps.push(dense, rows, state, ids))
        self._take(values, ids, pulled)

    def _on_ps(self, call: Callable[[PSClient], Any]) -> Any:
        """``call(ps)``'s answer; while the PS is away, reconnects (which gives up after the
        master timeout) and calls again."""
        while True:
            try:
                return call(self._connection.ps)
            except PSUnavailableError as e:
                log.warning("%s; reconnecting", e)
                self._connection.connect_ps()

    def _take(self, values: dict, ids: dict, rows: dict) -> None:
        self.parameters.assign(values, {n: (ids[n], rows[n]) for n in ids})
        #: The rows last taken, which the next window starts from.
        self._held = (ids, rows)
        if values:
            self._base = {n: values[n] for n in self.parameters.dense}
