"""The master's TensorBoard event files, ``--output/tensorboard/``, written with tf.summary.

The series are :mod:`elastic_step.master.reporting.scalar_series`'s, each at step = model version.

TensorFlow writes local files only (it no longer speaks S3): with an object-store
``--output`` the events are written to the master's local directory and copied to
``--output/tensorboard/`` at every write.
Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py.
"""

from __future__ import annotations

import os

from elastic_step.data import storage
from elastic_step.master.reporting.api import JobView
from elastic_step.master.reporting.scalar_series import NewScalars
from elastic_step.model.summaries import ScalarWriter
from elastic_step.output_layout import OutputLayout


class TrainingEvents:
    def __init__(self, output: str, local_dir: str, *, already: JobView | None = None) -> None:
        target = OutputLayout(output).tensorboard_dir
        if storage.is_local(target):
            self._logdir, self._mirror = storage.local_path(target), None
        else:
            self._logdir, self._mirror = os.path.join(local_dir, "tensorboard"), target
        os.makedirs(self._logdir, exist_ok=True)
        self._writer = ScalarWriter(self._logdir)
        self._scalars = NewScalars(already)

    def write(self, view: JobView, *, final: bool = False) -> None:
        """Writes what is new in ``view``; ``final``: the job is over, the last window too."""
        points = self._scalars.take(view, final=final)
        self._writer.write(points)
        if self._mirror is not None:
            for name in os.listdir(self._logdir):
                with open(os.path.join(self._logdir, name), "rb") as f:
                    storage.write_bytes_atomic(storage.join(self._mirror, name), f.read())

    def close(self) -> None:
        self._writer.close()
