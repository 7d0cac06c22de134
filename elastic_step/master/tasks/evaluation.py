"""Turns an evaluation round's summed metric states into metric values.
Tests: tests/e2e/test_keras_models.py (the job's last evaluation equals Keras's evaluate())."""

from __future__ import annotations

import numpy as np

from elastic_step.master.tasks.api import EvaluationRound


def metric_values(metrics: dict, round_: EvaluationRound) -> dict[str, float | list]:
    """Loss and each metric's result, from the states the workers' tasks added up."""
    values: dict[str, float | list] = {}
    if round_.example_count:
        values["loss"] = round_.loss_sum / round_.example_count
    states = iter(round_.metric_states or [])
    for name, metric in metrics.items():
        metric.reset_state()
        for variable in metric.variables:
            state = next(states, None)
            if state is not None:
                variable.assign(np.asarray(state).astype(variable.dtype))
        result = np.asarray(metric.result())
        values[name] = float(result) if result.ndim == 0 else result.tolist()
    return values
