"""The master's TensorBoard event files, ``--output/tensorboard/``, written with tf.summary.

Series, each at step = model version:
- ``eval/loss``, ``eval/NAME``: each evaluation round's scalar metrics, at the version it
  measured;
- ``train/loss``, ``train/NAME``: each training-loss window's mean, at its highest version,
  once the next window has begun (the last one at the end);
- ``job/live_workers``, ``job/examples_per_second``: at each write;
- ``restarts/REASON``: worker and PS restarts so far, when the count changes.

TensorFlow writes local files only (it no longer speaks S3): with an object-store
``--output`` the events are written to the master's local directory and copied to
``--output/tensorboard/`` at every write. A resumed master skips the rounds and windows the
record already held when it started, so TensorBoard does not show them twice.
Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py.
"""

from __future__ import annotations

import os

from elastic_step.data import storage
from elastic_step.master.job_view import JobView, scalar_metrics
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
        self._rounds: set[int] = set()
        self._windows: set[int] = set()
        if already is not None:
            self._rounds = {e["round"] for e in already.evaluations}
            # The newest window may still grow: it is written when it is complete.
            self._windows = {w["window"] for w in already.train_loss[:-1]}
        self._restarts: dict[str, int] = {}

    def write(self, view: JobView, *, final: bool = False) -> None:
        """Writes what is new in ``view``; ``final``: the job is over, the last window too."""
        points: list[tuple[str, float, int]] = []
        for entry in view.evaluations:
            if entry["round"] in self._rounds or entry.get("model_version") is None:
                continue
            for name, value in scalar_metrics(entry).items():
                points.append((f"eval/{name}", value, entry["model_version"]))
            self._rounds.add(entry["round"])
        complete = view.train_loss if final else view.train_loss[:-1]
        for window in complete:
            if window["window"] in self._windows:
                continue
            step = window["max_model_version"]
            points.append(("train/loss", window["loss"], step))
            for name, value in scalar_metrics(window).items():
                points.append((f"train/{name}", value, step))
            self._windows.add(window["window"])
        step = view.model_version
        points.append(("job/live_workers", view.live_workers, step))
        if view.examples_per_second is not None:
            points.append(("job/examples_per_second", view.examples_per_second, step))
        for reason, count in sorted(view.restarts_by_reason.items()):
            if self._restarts.get(reason) != count:
                points.append((f"restarts/{reason}", count, step))
                self._restarts[reason] = count
        self._writer.write(points)
        if self._mirror is not None:
            for name in os.listdir(self._logdir):
                with open(os.path.join(self._logdir, name), "rb") as f:
                    storage.write_bytes_atomic(storage.join(self._mirror, name), f.read())

    def close(self) -> None:
        self._writer.close()
