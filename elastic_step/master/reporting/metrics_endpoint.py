"""The master's Prometheus endpoint (``--metrics-port``): the job's state at each scrape.

Every scrape takes one :class:`JobView` under the coordinator's lock, so the numbers are
those of one moment and nothing is counted twice. Served with prometheus_client's own HTTP
server, on the address where the master listens (loopback locally, the pod IP on
Kubernetes). :data:`METRICS` declares each metric: its name, type, help and labels, and when
a scrape leaves it out; the collector makes its metrics from there, and the documentation
site's reference lists them from there too (docs/hooks.py).

Tests: tests/unit/test_watching_master.py, tests/e2e/test_watching.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from elastic_step.errors import InputError
from elastic_step.master.reporting.api import JobView, scalar_metrics

PREFIX = "elastic_step"


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the endpoint."""

    name: str  # without PREFIX; a counter is exposed with "_total" after it
    kind: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()
    #: When a scrape leaves it out; None: it is always there.
    absent: str | None = None

    @property
    def exposed(self) -> str:
        """The name a scrape shows."""
        return f"{PREFIX}_{self.name}" + ("_total" if self.kind == "counter" else "")


_NO_EVALUATION = "before the first evaluation"
_NO_WINDOW = "before the first training-loss window"

#: Every metric of the endpoint, by name.
METRICS = {
    spec.name: spec
    for spec in (
        MetricSpec("tasks", "gauge", "Tasks to do, under way and done", ("kind", "state")),
        MetricSpec(
            "instances", "gauge", "Live workers, standbys and PS by state", ("role", "state")
        ),
        MetricSpec(
            "restarts",
            "counter",
            "Worker and PS restarts by how the replaced instance ended",
            ("reason",),
        ),
        MetricSpec("master_restarts", "counter", "Masters that resumed this job"),
        MetricSpec(
            "examples_per_second",
            "gauge",
            "Steady-state training examples per second",
            absent="before the first tasks are done",
        ),
        MetricSpec("model_version", "gauge", "The job's model version"),
        MetricSpec("epoch", "gauge", "The oldest epoch not fully trained"),
        MetricSpec("elapsed_seconds", "gauge", "Seconds since the job first started"),
        MetricSpec(
            "eta_seconds",
            "gauge",
            "Seconds of training left at the steady-state rate",
            absent="before the steady-state rate is known",
        ),
        MetricSpec(
            "evaluation",
            "gauge",
            "The latest evaluation's metrics",
            ("metric",),
            absent=_NO_EVALUATION,
        ),
        MetricSpec(
            "evaluation_model_version",
            "gauge",
            "The model version the latest evaluation measured",
            absent=_NO_EVALUATION,
        ),
        MetricSpec(
            "train",
            "gauge",
            "The newest training-loss window's mean loss and metrics so far",
            ("metric",),
            absent=_NO_WINDOW,
        ),
        MetricSpec(
            "train_model_version",
            "gauge",
            "The highest model version in the newest training-loss window",
            absent=_NO_WINDOW,
        ),
    )
}


def _family(name: str, value: float | None = None) -> Metric:
    """The metric family of :data:`METRICS`' ``name``: with labels, empty (add its
    samples); without, holding ``value``."""
    spec = METRICS[name]
    family = GaugeMetricFamily if spec.kind == "gauge" else CounterMetricFamily
    if spec.labels:
        return family(f"{PREFIX}_{name}", spec.help, labels=list(spec.labels))
    return family(f"{PREFIX}_{name}", spec.help, value=value)


class JobCollector:
    """A prometheus_client collector over the views ``view_of`` returns."""

    def __init__(self, view_of: Callable[[], JobView]) -> None:
        self._view_of = view_of

    def collect(self) -> Iterator[Metric]:
        view = self._view_of()
        tasks = _family("tasks")
        for kind, states in view.tasks.items():
            for state, count in states.items():
                tasks.add_metric([kind, state], count)
        yield tasks
        instances = _family("instances")
        for role, states in view.instances.items():
            for state, count in states.items():
                instances.add_metric([role, state], count)
        yield instances
        restarts = _family("restarts")
        for reason, count in sorted(view.restarts_by_reason.items()):
            restarts.add_metric([reason], count)
        yield restarts
        yield _family("master_restarts", view.master_restarts)
        for name, value in (
            ("examples_per_second", view.examples_per_second),
            ("model_version", view.model_version),
            ("epoch", view.epoch),
            ("elapsed_seconds", view.elapsed_s),
            ("eta_seconds", view.eta_s),
        ):
            if value is not None:
                yield _family(name, value)
        latest = view.latest_evaluation
        if latest is not None:
            evaluation = _family("evaluation")
            for metric, value in sorted(scalar_metrics(latest).items()):
                evaluation.add_metric([metric], value)
            yield evaluation
            yield _family("evaluation_model_version", latest["model_version"])
        if view.train_loss:
            window = view.train_loss[-1]
            train = _family("train")
            for metric, value in sorted({"loss": window["loss"], **scalar_metrics(window)}.items()):
                train.add_metric([metric], value)
            yield train
            yield _family("train_model_version", window["max_model_version"])


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
