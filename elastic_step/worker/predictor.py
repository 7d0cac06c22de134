"""A worker's prediction tasks (``elastic-step predict``): the model forward on the task's
records, and the task's part of the predictions written atomically once.

The weights come from the trained model's ``model.keras``, loaded once per worker: nothing
changes them during a prediction job, so there is no PS to ask.
Tests: tests/e2e/test_predict.py (test_predictions_are_the_trained_models_outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from elastic_step.data import storage
from elastic_step.data.predict_output import format_part, part_path
from elastic_step.data.schema import Schema
from elastic_step.worker.windows import UserCodeError


class Predictor:
    def __init__(self, model, schema: Schema, parts_dir: str, on_batch: Callable[[], None]) -> None:
        import tensorflow as tf

        self._schema = schema
        self._parts_dir = parts_dir
        self._on_batch = on_batch
        self._forward = tf.function(lambda features: model(features, training=False))

    def predict(self, task, batches: Iterable[tuple]) -> None:
        """Runs the model on ``batches`` (the task's, in record order) and writes the part."""
        import keras

        outputs = []
        for features, _ in batches:
            try:
                outputs.append(keras.ops.convert_to_numpy(self._forward(features)))
            except Exception as e:
                raise UserCodeError.of("the model", e) from e
            self._on_batch()
        rows = np.concatenate(outputs) if outputs else np.zeros((0, 1), np.float32)
        if len(rows) != task.end - task.start:
            raise UserCodeError(
                f"the model gave {len(rows)} outputs for {task.end - task.start} records"
            )
        text = format_part(task.first_index, rows, self._schema)
        storage.write_text_atomic(part_path(self._parts_dir, task.id), text)
