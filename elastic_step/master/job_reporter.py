"""What a running job shows its user, apart from its log's decisions: status.json every
second, a progress line and TensorBoard's events every few seconds, with
``--metrics-port`` a Prometheus endpoint, and with a tracking server the same series in
MLflow (the kind starts it: see JobKind.start_tracking). Tests: tests/e2e/test_watching.py,
tests/unit/test_watching_master.py and tests/e2e/test_mlflow.py."""

from __future__ import annotations

import logging
import time

from elastic_step.master.job_kind import JobKind
from elastic_step.master.job_state.api import Phase
from elastic_step.master.job_state.coordinator import Coordinator
from elastic_step.master.reporting import reports
from elastic_step.master.reporting.api import JobView, scalar_metrics
from elastic_step.master.reporting.metrics_endpoint import MetricsEndpoint
from elastic_step.master.reporting.tensorboard_events import TrainingEvents
from elastic_step.master.tracking.api import RunStatus
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step.master")

STATUS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0
#: The longest the end of a job waits for its tracking run's artifacts and end (a large
#: model's upload); a server that is away costs a few seconds at most.
TRACKING_FINISH_TIMEOUT_S = 120.0
_ENDED_AS = {Phase.FAILED: RunStatus.FAILED, Phase.INTERRUPTED: RunStatus.KILLED}


class JobReporter:
    def __init__(
        self,
        coordinator: Coordinator,
        kind: JobKind,
        *,
        output: str,
        local_dir: str,
        resumed: bool,
        events: TrainingEvents | None = None,
    ) -> None:
        """``events``: where TensorBoard's series go (default: --output/tensorboard/)."""
        self.coordinator = coordinator
        self.kind = kind
        self.paths = OutputLayout(output)
        #: Where instances reach the master; set once its server listens.
        self.master_address = ""
        self._endpoint: MetricsEndpoint | None = None
        # A resumed master skips what the record already held: TensorBoard shows it once.
        already = self.view() if resumed else None
        self._events = events or TrainingEvents(output, local_dir, already=already)
        self._tracking = kind.start_tracking(coordinator)
        self._next_status = self._next_progress = 0.0

    def serve_metrics(self, host: str, port: int) -> None:
        self._endpoint = MetricsEndpoint(self.view, host, port)
        log.info("Prometheus metrics at http://%s/metrics", self._endpoint.address)

    def view(self) -> JobView:
        with self.coordinator.lock:
            return JobView.of(self.coordinator)

    def tick(self) -> None:
        """Writes status.json, and the progress line and events, when they are due."""
        now = time.monotonic()
        if now >= self._next_status:
            self.write_status()
            self._next_status = now + STATUS_EVERY_S
        if now >= self._next_progress:
            coordinator = self.coordinator
            with coordinator.lock:
                line = self.kind.progress_line(coordinator)
            log.info("%s", line)
            view = self.view()
            self._events.write(view)
            if self._tracking is not None:
                self._tracking.update(view)
            self._next_progress = now + PROGRESS_EVERY_S

    def write_status(self) -> None:
        coordinator = self.coordinator
        with coordinator.lock:
            document = reports.status(
                coordinator,
                self.master_address,
                self._endpoint.address if self._endpoint else None,
                kind=self.kind.command,
                progress=self.kind.progress(coordinator),
            )
        reports.write_json(self.paths.status, document)

    def finish(self) -> None:
        """The last status and events (the last training-loss window too), and the tracking
        run's last metrics, its artifacts and its end."""
        self.write_status()
        view = self.view()
        self._events.write(view, final=True)
        if self._tracking is not None:
            with self.coordinator.lock:
                final = self.coordinator.record.final_metrics()
            self._tracking.finish(
                view,
                status=RunStatus.FINISHED,
                final_metrics=scalar_metrics({"metrics": final}),
                artifacts=self.kind.tracking_artifacts(),
                timeout_s=TRACKING_FINISH_TIMEOUT_S,
            )
            self._tracking.close()
            self._tracking = None

    def close(self) -> None:
        """Stops serving; a tracking run not finished ends as the job did: failed, or
        killed when the run was stopped (a resumed job reopens it). Left running when the
        job is handed to the next master."""
        if self._endpoint is not None:
            self._endpoint.close()
        self._events.close()
        if self._tracking is not None:
            status = _ENDED_AS.get(self.coordinator.phase)
            if status is not None:
                self._tracking.finish(
                    None, status=status, final_metrics={}, artifacts=[], timeout_s=10.0
                )
            self._tracking.close()
