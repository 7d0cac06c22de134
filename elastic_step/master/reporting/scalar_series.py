"""The scalar series a running job shows in TensorBoard and MLflow, each point once.

Series, each at step = model version (the same names in both):
- ``eval/loss``, ``eval/NAME``: each evaluation round's scalar metrics, at the version it
  measured;
- ``train/loss``, ``train/NAME``: each training-loss window's mean, at its highest version,
  once it is final: the next window has begun, and no training task still out can report
  into it (a late report would change it after it was shown); the last one at the end;
- ``job/live_workers``, ``job/examples_per_second``: at each take;
- ``restarts/REASON``: worker and PS restarts so far, when the count changes.

A resumed master passes the view it started with: the rounds and windows already held then
were shown by the master before it, and are not shown twice.
Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py, tests/e2e/test_mlflow.py.
"""

from __future__ import annotations

from elastic_step.master.reporting.api import JobView, scalar_metrics

#: (series name, value, step).
ScalarPoint = tuple[str, float, int]


class NewScalars:
    def __init__(self, already: JobView | None = None) -> None:
        self._rounds: set[int] = set()
        self._windows: set[int] = set()
        if already is not None:
            self._rounds = {e["round"] for e in already.evaluations}
            # The newest window may still grow: it is taken when it is complete.
            self._windows = {w["window"] for w in already.train_loss[:-1]}
        self._restarts: dict[str, int] = {}

    def take(self, view: JobView, *, final: bool = False) -> list[ScalarPoint]:
        """The points of ``view`` not taken before; ``final``: the job is over, so its last
        training window is complete too."""
        points: list[ScalarPoint] = []
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
            open_from = view.first_open_window
            if not final and open_from is not None and window["window"] >= open_from:
                break  # it, and those after it, may still grow
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
        return points
