"""The master's MLflow logging, on a thread of its own: it never fails or slows the job.

The master hands it what there is to log (:meth:`TrackingRecorder.update`, at the progress
cadence; :meth:`finish` at the end); the thread opens the run, logs the params once, and
sends the metrics in batches. When the server is away the points wait (the newest
``MAX_WAITING`` of them) and the thread tries again after a backoff that doubles up to
``MAX_RETRY_S``, with one warning when it starts failing and one line when it answers
again. At the end the master waits for the last metrics, the artifacts and the run's end at
most ``finish``'s timeout, and the thread gives up on them after ``FINISH_TRIES`` failed
tries: the job ends either way.
Tests: tests/unit/test_tracking.py, tests/e2e/test_mlflow.py.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from elastic_step.data import storage
from elastic_step.master.reporting.api import JobView
from elastic_step.master.reporting.scalar_series import NewScalars, ScalarPoint
from elastic_step.master.tracking.api import MetricPoint, RunStatus, RunTracker

log = logging.getLogger("elastic_step.master")

#: Seconds between sends while the server answers.
SEND_EVERY_S = 2.0
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 30.0
#: Points kept while the server is away; older ones are dropped, and counted.
MAX_WAITING = 100_000
FINISH_TRIES = 2


@dataclass
class _Ending:
    status: RunStatus
    final_metrics: dict[str, float]
    #: (local path, artifact path) of each upload not done yet.
    artifacts: list[tuple[str, str | None]]
    end_run: bool
    tries: int = 0
    done: threading.Event = field(default_factory=threading.Event)


class TrackingRecorder:
    def __init__(
        self,
        tracker: RunTracker,
        *,
        where: str,
        params: dict[str, str],
        resume_run_id: str | None,
        on_run: Callable[[str], None],
        owns_run: bool = True,
    ) -> None:
        """``where``: the server and why it is used, for the log. ``resume_run_id``: the run
        the job made before its master restarted. ``on_run``: called with the run's id once
        it is open (the master keeps it, to resume the run). ``owns_run``: the job ends the
        run (not when the platform that made it does).

        A restarted master takes every point of the job again, and sends those the run
        does not have (a multiset: two rounds may measure one model): none twice, and none
        lost that the master before it had not sent."""
        self.owns_run = owns_run
        self._tracker = tracker
        self._where = where
        self._params: dict[str, str] | None = params
        self._resume = resume_run_id
        self._on_run = on_run
        self._scalars = NewScalars()
        #: The points the run already had when it was opened, as (key, step, value).
        self._logged: Counter[tuple[str, int, float]] = Counter()
        self._lock = threading.Lock()
        self._waiting: deque[MetricPoint] = deque()
        self._dropped = 0
        #: The timestamp of the last point queued, in milliseconds.
        self._stamp = 0
        self._ending: _Ending | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self.run_id: str | None = None
        self._scratch_dir: str | None = None
        self._thread = threading.Thread(target=self._loop, name="mlflow", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def update(self, view: JobView) -> None:
        """Queues what is new in ``view``; returns at once."""
        self._queue(self._scalars.take(view))

    def finish(
        self,
        view: JobView | None,
        *,
        status: RunStatus,
        final_metrics: dict[str, float],
        artifacts: list[tuple[str, str | None]],
        timeout_s: float,
    ) -> None:
        """Queues the last points of ``view`` (the last training window too), the final
        metrics (as ``final/NAME``), the artifacts (path or URI, artifact path) and, if the
        job owns the run, its end with ``status``; waits for them at most ``timeout_s``."""
        if view is not None:
            self._queue(self._scalars.take(view, final=True))
        ending = _Ending(status, final_metrics, list(artifacts), self.owns_run)
        with self._lock:
            self._ending = ending
        self._wake.set()
        if not ending.done.wait(timeout_s):
            log.warning(
                "MLflow: the run's last metrics, artifacts and end were not sent within %.0f s; "
                "the job ends without them",
                timeout_s,
            )

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)
        if self._scratch_dir is not None:
            shutil.rmtree(self._scratch_dir, ignore_errors=True)

    def _scratch(self) -> str:
        """A local directory for artifacts fetched from an object store."""
        if self._scratch_dir is None:
            self._scratch_dir = storage.local_temp_dir("elastic-step-mlflow-")
        return self._scratch_dir

    # -- the thread --

    def _queue(self, points: list[ScalarPoint]) -> None:
        with self._lock:
            for name, value, step in points:
                if len(self._waiting) == MAX_WAITING:
                    self._waiting.popleft()
                    self._dropped += 1
                # A millisecond apart at least: MLflow keeps one of two points that agree
                # in key, step, value and timestamp (two rounds of one model would).
                self._stamp = max(int(time.time() * 1000), self._stamp + 1)
                self._waiting.append(MetricPoint(name, float(value), int(step), self._stamp))

    def _loop(self) -> None:
        delay = FIRST_RETRY_S
        while not self._stop.is_set():
            with self._lock:
                ending = self._ending
            try:
                self._send(ending)
            except Exception as e:  # whatever fails (the server, an artifact), the job goes on
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "MLflow at %s: %s; the job goes on, and %d points wait for the server",
                        self._where,
                        e,
                        len(self._waiting),
                    )
                if ending is not None:
                    ending.tries += 1
                    if ending.tries >= FINISH_TRIES:
                        log.warning(
                            "MLflow: gave up on the run's last metrics, artifacts and end "
                            "(%d points not sent): %s",
                            len(self._waiting),
                            e,
                        )
                        ending.done.set()
                        return
                    delay = FIRST_RETRY_S
                self._wake.wait(delay)
                self._wake.clear()
                delay = min(delay * 2, MAX_RETRY_S)
                continue
            if self._failing:
                self._failing = False
                log.info("MLflow at %s answers again; the waiting points are sent", self._where)
            if ending is not None:
                ending.done.set()
                return
            delay = FIRST_RETRY_S
            self._wake.wait(SEND_EVERY_S)
            self._wake.clear()

    def _send(self, ending: _Ending | None) -> None:
        """Opens the run, logs the params, sends the waiting points, then ``ending``'s work.
        What was sent is not sent again after a failure."""
        tracker = self._tracker
        if self.run_id is None:
            self.run_id = tracker.open(self._resume)
            self._logged = tracker.logged_points()
            log.info("MLflow: logging to run %s at %s", self.run_id, self._where)
            self._on_run(self.run_id)
        if self._params is not None:
            tracker.log_params(self._params)
            self._params = None
        with self._lock:
            batch = list(self._waiting)
        logged = self._logged.copy()  # counted off only once the batch is sent
        new = [p for p in batch if not _counted_off(logged, p)]
        if new:
            tracker.log_metrics(new)
        self._logged = logged
        with self._lock:
            for point in batch:  # those _queue dropped meanwhile are gone already
                if self._waiting and self._waiting[0] is point:
                    self._waiting.popleft()
        if ending is None:
            return
        if ending.final_metrics:
            now = int(time.time() * 1000)
            tracker.log_metrics(
                [MetricPoint(f"final/{k}", v, 0, now) for k, v in ending.final_metrics.items()]
            )
            ending.final_metrics = {}
        while ending.artifacts:
            source, artifact_path = ending.artifacts[0]
            if storage.exists(source):
                tracker.log_artifact(storage.fetch(source, self._scratch()), artifact_path)
            else:
                log.info("MLflow: %s is not there; not uploaded", source)
            ending.artifacts.pop(0)
        if ending.end_run:
            tracker.end(ending.status)
        if self._dropped:
            log.warning("MLflow: %d points were dropped while the server was away", self._dropped)


def _counted_off(logged: Counter[tuple[str, int, float]], point: MetricPoint) -> bool:
    """Whether ``logged`` still holds ``point``; if so, takes one of it off."""
    key = (point.key, point.step, point.value)
    if logged[key] > 0:
        logged[key] -= 1
        return True
    return False
