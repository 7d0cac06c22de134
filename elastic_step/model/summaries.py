"""TensorBoard event files, written with ``tf.summary``: the master's one use of TensorFlow
that is not a model (:mod:`elastic_step.master.reporting.tensorboard_events` decides what to write).
Tests: tests/e2e/test_watching.py (the series a job writes)."""

from __future__ import annotations


class ScalarWriter:
    """Scalar series in the event files of a local directory."""

    def __init__(self, logdir: str) -> None:
        import tensorflow as tf

        self._tf = tf
        self._writer = tf.summary.create_file_writer(logdir)

    def write(self, points: list[tuple[str, float, int]]) -> None:
        """Writes each ``(series, value, step)`` and flushes them to the files."""
        with self._writer.as_default():
            for series, value, step in points:
                self._tf.summary.scalar(series, value, step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
