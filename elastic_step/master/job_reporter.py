"""What a running job shows its user, apart from its log's decisions: status.json every
second, a progress line and TensorBoard's events every few seconds, and with
``--metrics-port`` a Prometheus endpoint. Tests: tests/e2e/test_watching.py and
tests/unit/test_watching_master.py."""

from __future__ import annotations

import logging
import time

from elastic_step.master import reports
from elastic_step.master.coordinator import Coordinator
from elastic_step.master.job_kind import JobKind
from elastic_step.master.job_view import JobView
from elastic_step.master.metrics_endpoint import MetricsEndpoint
from elastic_step.master.tensorboard_events import TrainingEvents
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step.master")

STATUS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0


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
            self._events.write(self.view())
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
        """The last status and events (the last training-loss window too)."""
        self.write_status()
        self._events.write(self.view(), final=True)

    def close(self) -> None:
        if self._endpoint is not None:
            self._endpoint.close()
        self._events.close()
