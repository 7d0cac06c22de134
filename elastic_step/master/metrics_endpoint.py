"""The master's Prometheus endpoint (``--metrics-port``): the job's state at each scrape.

Every scrape takes one :class:`JobView` under the coordinator's lock, so the numbers are
those of one moment and nothing is counted twice. Served with prometheus_client's own HTTP
server, on the address where the master listens (loopback locally, the pod IP on
Kubernetes). Metric names:

- ``elastic_step_tasks{kind, state}``: tasks to do, under way and done (kind ``train`` or
  ``evaluate``);
- ``elastic_step_instances{role, state}``: live workers, standbys and PS, ``pending`` or
  ``running``;
- ``elastic_step_restarts_total{reason}``: worker and PS restarts by how the replaced one
  ended; ``elastic_step_master_restarts_total``;
- ``elastic_step_examples_per_second``: the steady-state training rate (absent before the
  first tasks are done);
- ``elastic_step_evaluation{metric}``: the latest evaluation's scalar metrics (loss
  included), and ``elastic_step_evaluation_model_version``;
- ``elastic_step_train{metric}``: the newest training-loss window's mean loss and metrics so
  far (see JobRecord.train_loss_windows), and ``elastic_step_train_model_version``, the
  highest model version it holds;
- ``elastic_step_model_version``, ``elastic_step_epoch``, ``elastic_step_elapsed_seconds``,
  ``elastic_step_eta_seconds``.

Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from elastic_step.errors import InputError
from elastic_step.master.job_view import JobView, scalar_metrics

PREFIX = "elastic_step"


class JobCollector:
    """A prometheus_client collector over the views ``view_of`` returns."""

    def __init__(self, view_of: Callable[[], JobView]) -> None:
        self._view_of = view_of

    def collect(self) -> Iterator[Metric]:
        view = self._view_of()
        tasks = GaugeMetricFamily(
            f"{PREFIX}_tasks", "Tasks to do, under way and done", labels=["kind", "state"]
        )
        for kind, states in view.tasks.items():
            for state, count in states.items():
                tasks.add_metric([kind, state], count)
        yield tasks
        instances = GaugeMetricFamily(
            f"{PREFIX}_instances",
            "Live workers, standbys and PS by state",
            labels=["role", "state"],
        )
        for role, states in view.instances.items():
            for state, count in states.items():
                instances.add_metric([role, state], count)
        yield instances
        restarts = CounterMetricFamily(
            f"{PREFIX}_restarts",
            "Worker and PS restarts by how the replaced instance ended",
            labels=["reason"],
        )
        for reason, count in sorted(view.restarts_by_reason.items()):
            restarts.add_metric([reason], count)
        yield restarts
        yield CounterMetricFamily(
            f"{PREFIX}_master_restarts", "Masters that resumed this job", value=view.master_restarts
        )
        for name, help_text, value in (
            (
                "examples_per_second",
                "Steady-state training examples per second",
                view.examples_per_second,
            ),
            ("model_version", "The job's model version", view.model_version),
            ("epoch", "The oldest epoch not fully trained", view.epoch),
            ("elapsed_seconds", "Seconds since the job first started", view.elapsed_s),
            ("eta_seconds", "Seconds of training left at the steady-state rate", view.eta_s),
        ):
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", help_text, value=value)
        latest = view.latest_evaluation
        if latest is not None:
            evaluation = GaugeMetricFamily(
                f"{PREFIX}_evaluation", "The latest evaluation's metrics", labels=["metric"]
            )
            for metric, value in sorted(scalar_metrics(latest).items()):
                evaluation.add_metric([metric], value)
            yield evaluation
            yield GaugeMetricFamily(
                f"{PREFIX}_evaluation_model_version",
                "The model version the latest evaluation measured",
                value=latest["model_version"],
            )
        if view.train_loss:
            window = view.train_loss[-1]
            train = GaugeMetricFamily(
                f"{PREFIX}_train",
                "The newest training-loss window's mean loss and metrics so far",
                labels=["metric"],
            )
            for metric, value in sorted({"loss": window["loss"], **scalar_metrics(window)}.items()):
                train.add_metric([metric], value)
            yield train
            yield GaugeMetricFamily(
                f"{PREFIX}_train_model_version",
                "The highest model version in the newest training-loss window",
                value=window["max_model_version"],
            )


class MetricsEndpoint:
    """The HTTP server of the endpoint; :meth:`close` stops it."""

    def __init__(self, view_of: Callable[[], JobView], host: str, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobCollector(view_of))
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise InputError(f"cannot serve metrics on --metrics-port {port} at {host}: {e}") from e
        #: The port it listens on (the one picked when ``port`` was 0).
        self.port: int = self._server.server_port
        self.address = f"{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
