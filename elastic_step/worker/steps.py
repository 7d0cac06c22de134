"""The compiled functions a worker runs on a batch.

- :meth:`Steps.gradients` (``--local-steps 1``): the step's loss and gradients, for the PS's
  optimizer.
- :meth:`Steps.local` (``--local-steps K > 1``): one step of the worker's own optimizer on its
  copy, as ``model.fit`` does: gradients and the dense update in one compiled call; table rows
  are updated row by row with per-row state (see ``model/row_optimizer.py``), in the
  window's rows that the worker holds (``worker/window_rows.py``), a group of tables of one
  width at a time, and :meth:`Steps.flush` spends their momentum at the end of a window. It
  returns the step's loss.
- :meth:`Steps.evaluate`: the batch's loss.
- ``Steps.local_window`` (K > 1, a model without tables): K of those local steps in one
  compiled call that takes its batches straight from the input pipeline's iterator, as
  ``model.fit`` does with ``steps_per_execution``: no Python per batch. It returns the summed
  loss (each batch's mean times its size), the examples, the dense values after the window
  and the metrics' results, and resets the metrics first in a task's first window: one call
  a window (:class:`WindowResult`). None where it does not apply. :meth:`Steps.run_window`
  calls it with the step count as a tensor, so that one trace serves windows of every length
  (a task's last window is often shorter).
- ``Steps.evaluation_window`` (a model without tables, any K): the same for evaluation
  batches, through :meth:`Steps.run_evaluation`. One trace serves every batch size, where
  :meth:`Steps.evaluate` traces again for a task's shorter last batch.

:meth:`Steps.warm_up` traces and instantiates both windows on zero steps, which trains and
measures nothing. A worker does that before its first task, so that neither the first task
nor the first evaluation round waits for a compile (the first evaluation's two traces held
training up for 350 ms in bench/throughput.py).

Each of them also adds the batch to the model's metrics (the definition's, as evaluation
reports them), in the same compiled call and on the outputs the step computed, as
``model.fit`` does: no second forward pass and no Python work per batch. The caller resets
them before a task and reads them after it (:meth:`reset_metrics`, :meth:`metric_results`;
the training window does both itself).

A table's gradient leaves the graph as (unique row ids, summed rows): what a push carries.
Tests: tests/unit/test_model_parameters.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from elastic_step.model.parameters import ModelParameters
from elastic_step.model.row_optimizer import RowOptimizer
from elastic_step.rpc.ps_client import Rows
from elastic_step.worker.window_rows import WindowRows

if TYPE_CHECKING:
    import keras


def _row_gradient(grad):
    """A table's gradient as (unique ids, summed rows), in the graph."""
    import tensorflow as tf

    if isinstance(grad, tf.IndexedSlices):
        ids, values = tf.cast(grad.indices, tf.int64), grad.values
    else:  # a table used other than by lookup: its non-zero rows
        ids = tf.reshape(tf.where(tf.reduce_any(tf.not_equal(grad, 0), axis=1)), [-1])
        values = tf.gather(grad, ids)
    unique, index = tf.unique(ids)
    return unique, tf.math.unsorted_segment_sum(values, index, tf.size(unique))


def _window_of(step: Callable, variables: list | None = None, metrics: Mapping | None = None):
    """A compiled loop of ``step`` over the next ``steps`` batches of an iterator, returning
    the summed loss (each batch's mean times its size), the examples, the values of
    ``variables`` after the loop and the results of ``metrics``, which it first resets where
    ``reset`` is true. In one call: a task's reads and resets apart took 1-2 ms of a worker
    whose other threads were reading the next task."""
    import tensorflow as tf

    variables, metrics = variables or [], dict(metrics or {})

    @tf.function
    def window(iterator, steps, reset):
        if reset:
            for metric in metrics.values():
                metric.reset_state()
        loss_sum = tf.constant(0.0, tf.float64)
        examples = tf.constant(0, tf.int64)
        for _ in tf.range(steps):
            features, labels = next(iterator)
            loss = step(features, labels)
            size = tf.shape(tf.nest.flatten(labels)[0], out_type=tf.int64)[0]
            loss_sum += tf.cast(loss, tf.float64) * tf.cast(size, tf.float64)
            examples += size
        values = [tf.convert_to_tensor(v) for v in variables]
        return loss_sum, examples, values, {n: m.result() for n, m in metrics.items()}

    return window


@dataclass
class WindowResult:
    """A compiled window's batches: their summed loss (each batch's mean times its size),
    their examples, the trainable dense values after them by name, and the model's metrics
    since they were last reset (those whose result is one number)."""

    loss_sum: float
    examples: int
    dense: dict[str, np.ndarray]
    metrics: dict[str, float]


def _run(
    window, iterator, steps: int, reset_metrics: bool = False
) -> tuple[float, int, list[np.ndarray], dict[str, float]]:
    """Calls a window of :func:`_window_of` with the step count as a tensor, so that one trace
    serves every count."""
    import tensorflow as tf

    loss_sum, examples, values, results = window(
        iterator, tf.constant(steps, tf.int32), tf.constant(reset_metrics)
    )
    return float(loss_sum), int(examples), [v.numpy() for v in values], _scalars(results)


def _scalars(results: Mapping) -> dict[str, float]:
    """The metrics' results that are one number."""
    scalars = {}
    for name, value in results.items():
        value = np.asarray(value)
        if value.ndim == 0:
            scalars[name] = float(value)
    return scalars


class Steps:
    def __init__(
        self,
        model,
        loss_fn: Callable,
        parameters: ModelParameters,
        local_optimizer=None,
        *,
        metrics: Mapping[str, keras.metrics.Metric] | None = None,
    ) -> None:
        import tensorflow as tf

        self._parameters = parameters
        #: The model's metrics by name; every step and evaluation batch updates them.
        self.metrics = dict(metrics or {})
        metric_objects = list(self.metrics.values())

        def update_metrics(labels, outputs) -> None:
            for metric in metric_objects:
                metric.update_state(labels, outputs)

        dense_names = list(parameters.dense)
        tables = list(parameters.tables)
        variables = [*parameters.dense.values(), *parameters.tables.values()]

        def loss_and_gradients(features, labels):
            with tf.GradientTape() as tape:
                outputs = model(features, training=True)
                loss = loss_fn(labels, outputs)
                if model.losses:
                    loss += tf.add_n(model.losses)
            update_metrics(labels, outputs)
            grads = tape.gradient(loss, variables)
            dense = dict(zip(dense_names, grads[: len(dense_names)], strict=True))
            rows = dict(zip(tables, grads[len(dense_names) :], strict=True))
            dense = {n: tf.convert_to_tensor(g) for n, g in dense.items() if g is not None}
            rows = {n: _row_gradient(g) for n, g in rows.items() if g is not None}
            return loss, dense, rows

        @tf.function(reduce_retracing=True)
        def gradients(features, labels):
            return loss_and_gradients(features, labels)

        self._gradients = gradients
        self._optimizer = local_optimizer
        if local_optimizer is not None:
            local_optimizer.build(list(parameters.dense.values()))
            layout = parameters.layout
            #: A row optimizer per group of tables (see model/table_rows.py).
            self._row_optimizers = [
                RowOptimizer(local_optimizer, group.rows, group.dim, group.dtype)
                for group in layout.groups
            ]

            def joined(rows):
                """Each group's rows of gradient, joined (table-blocked)."""
                out = []
                for group in layout.groups:
                    ids, values = [tf.zeros([0], tf.int64)], [tf.zeros([0, group.dim], group.dtype)]
                    for i, name in enumerate(group.names):
                        if name in rows:
                            ids.append(rows[name][0] + int(group.offsets[i]))
                            values.append(tf.cast(rows[name][1], group.dtype))
                    out.append((tf.concat(ids, 0), tf.concat(values, 0)))
                return out

            @tf.function(reduce_retracing=True)
            def local(features, labels):
                loss, dense, rows = loss_and_gradients(features, labels)
                local_optimizer.apply(list(dense.values()), [parameters.dense[n] for n in dense])
                return loss, joined(rows)

            self._local = local

        #: See the module's docstring.
        self.local_window = None
        if local_optimizer is not None and not tables:

            def local_step(features, labels):
                loss, dense, _ = loss_and_gradients(features, labels)
                local_optimizer.apply(list(dense.values()), [parameters.dense[n] for n in dense])
                return loss

            self.local_window = _window_of(
                local_step, list(parameters.dense.values()), self.metrics
            )

        def evaluation_step(features, labels):
            outputs = model(features, training=False)
            update_metrics(labels, outputs)
            return loss_fn(labels, outputs)

        self.evaluate = tf.function(evaluation_step, reduce_retracing=True)
        #: See the module's docstring.
        self.evaluation_window = None if tables else _window_of(evaluation_step)

    def run_window(self, iterator, steps: int, reset_metrics: bool = False) -> WindowResult:
        """``local_window`` on the next ``steps`` batches of ``iterator``, the model's metrics
        first reset if ``reset_metrics`` (a task's first window)."""
        loss_sum, examples, values, metrics = _run(
            self.local_window, iterator, steps, reset_metrics
        )
        dense = dict(zip(self._parameters.dense, values, strict=True))
        return WindowResult(loss_sum, examples, dense, metrics)

    def run_evaluation(self, iterator, steps: int) -> tuple[float, int]:
        """``evaluation_window`` on the next ``steps`` batches of ``iterator``: their summed
        loss and their examples; the batches are added to the metrics."""
        loss_sum, examples, _, _ = _run(self.evaluation_window, iterator, steps)
        return loss_sum, examples

    def warm_up(self, training=None, evaluation=None) -> list[str]:
        """Compiles the windows that apply for the iterators given (the training and the
        evaluation input pipelines') without running them: each call runs zero steps, so no
        batch is taken, no variable changes and no metric moves. Returns the windows it
        compiled ("training", "evaluation"); the steps of a window that does not apply
        compile at their first batch."""
        compiled = []
        if training is not None and self.local_window is not None:
            self.run_window(training, 0)
            compiled.append("training")
        if evaluation is not None and self.evaluation_window is not None:
            self.run_evaluation(evaluation, 0)
            compiled.append("evaluation")
        return compiled

    def reset_metrics(self) -> None:
        for metric in self.metrics.values():
            metric.reset_state()

    def metric_results(self) -> dict[str, float]:
        """Each metric's value over the batches since :meth:`reset_metrics`, for the metrics
        whose result is one number."""
        return _scalars({name: metric.result() for name, metric in self.metrics.items()})

    def gradients(self, features, labels) -> tuple[float, dict[str, np.ndarray], Rows]:
        """The batch's loss and gradients: dense ones by name, and each table's (unique ids,
        rows)."""
        loss, dense, rows = self._gradients(features, labels)
        return (
            float(loss),
            {n: g.numpy() for n, g in dense.items()},
            {n: (ids.numpy(), g.numpy()) for n, (ids, g) in rows.items()},
        )

    def local(self, features, labels, window: WindowRows) -> float:
        """One step of the worker's own optimizer on its copy of the model (the rows of the
        batch's tables in ``window``, and the model's tables); its loss."""
        # Read before the step: the dense update advances a schedule's iteration count.
        lr = float(self._optimizer.learning_rate)
        loss, grads = self._local(features, labels)
        step = int(self._optimizer.iterations)  # this step's, counted by the dense update
        changed_ids, changed = [], []
        for group, (ids, group_grads) in enumerate(grads):
            ids = ids.numpy()
            at = window.positions(group, ids)
            values = window.values[group][at]
            window.optimizers[group].apply(values, at, group_grads.numpy(), lr, step)
            window.values[group][at] = values
            changed_ids.append(ids)
            changed.append(values)
        self._parameters.row_access().scatter(changed_ids, changed)
        return float(loss)

    def flush(self, window: WindowRows) -> None:
        """At the end of a window of local steps: its rows move by what their momentum would
        still move them, and it is spent (see RowOptimizer.flush): the window's change then
        carries all its gradients' effect to the PS."""
        lr = float(self._optimizer.learning_rate)
        step = int(self._optimizer.iterations)
        for values, optimizer in zip(window.values, window.optimizers, strict=True):
            if len(values):  # flush does nothing for an optimizer without momentum
                optimizer.flush(values, slice(None), step, lr)
        window.put_state(self._row_optimizers)
        self._parameters.row_access().scatter(window.ids, window.values)

    def window_rows(self, ids: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> WindowRows:
        """The rows ``ids`` of the tables, pulled as ``values``, for a window of local steps
        (which :meth:`flush` ends)."""
        return WindowRows(self._parameters.layout, ids, values, self._row_optimizers)
