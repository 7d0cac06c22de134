"""What the report reads, checked and typed: an ``evaluate`` result and a ``summary.json``.

Both may come from files a user handed over; a value of the wrong shape is an
:class:`InputError` that names the field, the rule and the value.
Tests: tests/unit/test_report.py (malformed input, load_summary).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.output_layout import OutputLayout


def _show(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else f"{text[:57]}..."


class _Fields:
    """Reads the fields of one JSON object; errors are prefixed with where it came from."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise InputError(f"{where} must be a JSON object, got {_show(obj)}")
        self.obj, self.where = obj, where

    def _get(self, key: str, rule: str, ok: Callable[[Any], bool], optional: bool) -> Any:
        if key not in self.obj or (optional and self.obj[key] is None):
            if optional:
                return None
            raise InputError(f"{self.where}: '{key}' is missing")
        value = self.obj[key]
        if not ok(value):
            raise InputError(f"{self.where}: '{key}' must be {rule}, got {_show(value)}")
        return value

    def number(self, key: str, *, optional: bool = False) -> float | None:
        value = self._get(key, "a number", is_number, optional)
        return None if value is None else float(value)

    def integer(self, key: str, *, optional: bool = False) -> int | None:
        return self._get(key, "an integer", is_integer, optional)

    def text(self, key: str, *, optional: bool = False) -> str | None:
        return self._get(key, "a string", lambda v: isinstance(v, str), optional)

    def items(self, key: str) -> list:
        """A list; missing or null reads as empty."""
        return self._get(key, "a list", lambda v: isinstance(v, list), True) or []

    def mapping(self, key: str) -> dict:
        """An object; missing or null reads as empty."""
        return self._get(key, "an object", lambda v: isinstance(v, dict), True) or {}

    def counts(self, key: str) -> dict[str, int]:
        counts = self.mapping(key)
        for name, value in counts.items():
            if not is_integer(value) or value < 0:
                raise InputError(
                    f"{self.where}: '{key}' must map names to counts, got {_show({name: value})}"
                )
        return counts


def is_number(value: Any) -> bool:
    """A JSON number (NaN and infinities included: a diverged loss is still reported)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scalars(metrics: dict) -> dict[str, float]:
    """The metrics with one number as their value; others (per-class lists) are not plotted."""
    return {name: float(v) for name, v in metrics.items() if is_number(v)}


@dataclass(frozen=True, kw_only=True)
class ConfusionMatrix:
    labels: list[str]
    #: What the rows and columns hold: "true label" and "predicted label".
    rows: str
    columns: str
    #: ``counts[true][predicted]``.
    counts: list[list[int]]


@dataclass(frozen=True, kw_only=True)
class RocPoint:
    threshold: float
    tpr: float
    fpr: float


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What :func:`elastic_step.evaluate.evaluate` returns."""

    split: str
    records: int
    loss: float
    #: Scalar metrics, for the header; ``other_metrics`` holds the rest as given.
    metrics: dict[str, float]
    other_metrics: dict[str, Any]
    confusion_matrix: ConfusionMatrix | None
    #: By falling threshold; empty when there is no curve.
    roc: list[RocPoint]

    @classmethod
    def parse(cls, evaluation: Any, *, where: str = "evaluation") -> Evaluation:
        fields = _Fields(evaluation, where)
        metrics = fields.mapping("metrics")
        matrix = None
        if fields.obj.get("confusion_matrix") is not None:
            matrix = _confusion_matrix(fields.obj["confusion_matrix"], f"{where}: confusion_matrix")
        roc = [
            _roc_point(point, f"{where}: roc[{i}]") for i, point in enumerate(fields.items("roc"))
        ]
        return cls(
            split=fields.text("split"),
            records=fields.integer("records"),
            loss=fields.number("loss"),
            metrics=_scalars(metrics),
            other_metrics={k: v for k, v in metrics.items() if not is_number(v)},
            confusion_matrix=matrix,
            roc=roc,
        )


def _confusion_matrix(obj: Any, where: str) -> ConfusionMatrix:
    fields = _Fields(obj, where)
    labels = fields.items("labels")
    counts = fields.items("matrix")
    size = len(labels)
    square = len(counts) == size and all(
        isinstance(row, list)
        and len(row) == size
        and all(is_integer(count) and count >= 0 for count in row)
        for row in counts
    )
    if not square or size == 0:
        raise InputError(
            f"{where}: 'matrix' must be {size} rows of {size} counts, one per label, "
            f"got {_show(counts)}"
        )
    return ConfusionMatrix(
        labels=[str(label) for label in labels],
        rows=fields.text("rows", optional=True) or "true label",
        columns=fields.text("columns", optional=True) or "predicted label",
        counts=counts,
    )


def _roc_point(obj: Any, where: str) -> RocPoint:
    fields = _Fields(obj, where)
    point = RocPoint(
        threshold=fields.number("threshold"), tpr=fields.number("tpr"), fpr=fields.number("fpr")
    )
    if not (0 <= point.tpr <= 1 and 0 <= point.fpr <= 1):
        raise InputError(f"{where}: 'tpr' and 'fpr' must lie in [0, 1], got {_show(obj)}")
    return point


@dataclass(frozen=True, kw_only=True)
class EvaluationRound:
    """One evaluation during training, of the model version it measured."""

    model_version: int
    epoch: int
    trigger: str
    loss: float | None
    metrics: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class TrainWindow:
    """The mean training loss and metrics over the batches trained in a window of model
    versions, as the workers reported them."""

    min_model_version: int
    max_model_version: int
    examples: int
    loss: float
    metrics: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class RestartEvent:
    #: Seconds since the job started, on the workers timeline's clock.
    at_s: float
    instance: str
    role: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class TrainingSummary:
    """What the report uses of a job's ``summary.json``."""

    phase: str
    error: str | None
    epochs: int
    #: ``(epoch, model version when it ended)`` of each ended epoch; empty in summaries
    #: that predate them.
    epoch_ends: list[tuple[int, int]]
    #: The model definition, the training data and when the summary was written; None in
    #: summaries that predate them.
    model_def: str | None
    data: str | None
    written_at: str | None
    evaluations: list[EvaluationRound]
    #: Oldest first; empty in summaries that predate them.
    train_windows: list[TrainWindow]
    #: ``(seconds since the job started, running workers)``, at each change.
    workers_timeline: list[tuple[float, int]]
    restart_events: list[RestartEvent]
    #: Seconds from the job's start to the summary; None in summaries that predate it.
    elapsed_s: float | None
    restarts: dict[str, int]
    restarts_by_reason: dict[str, int]
    examples_per_second: float | None
    model_version: int | None

    @classmethod
    def parse(cls, summary: Any, *, where: str = "summary") -> TrainingSummary:
        fields = _Fields(summary, where)
        timeline = []
        for i, point in enumerate(fields.items("workers_timeline")):
            if not (
                isinstance(point, list)
                and len(point) == 2
                and is_number(point[0])
                and is_integer(point[1])
            ):
                raise InputError(
                    f"{where}: workers_timeline[{i}] must be [seconds, workers], got {_show(point)}"
                )
            timeline.append((float(point[0]), point[1]))
        return cls(
            phase=fields.text("phase", optional=True) or "unknown",
            error=fields.text("error", optional=True),
            epochs=len(fields.items("epochs")),
            epoch_ends=[
                end
                for i, e in enumerate(fields.items("epochs"))
                if (end := _epoch_end(e, f"{where}: epochs[{i}]")) is not None
            ],
            model_def=fields.text("model_def", optional=True),
            data=fields.text("data", optional=True),
            written_at=fields.text("written_at", optional=True),
            evaluations=[
                _evaluation_round(e, f"{where}: evaluations[{i}]")
                for i, e in enumerate(fields.items("evaluations"))
            ],
            train_windows=[
                _train_window(w, f"{where}: train_loss[{i}]")
                for i, w in enumerate(fields.items("train_loss"))
            ],
            workers_timeline=timeline,
            restart_events=[
                _restart_event(e, f"{where}: restart_events[{i}]")
                for i, e in enumerate(fields.items("restart_events"))
            ],
            elapsed_s=fields.number("elapsed_s", optional=True),
            restarts=fields.counts("restarts"),
            restarts_by_reason=fields.counts("restarts_by_reason"),
            examples_per_second=fields.number("examples_per_second", optional=True),
            model_version=fields.integer("model_version", optional=True),
        )


def _evaluation_round(obj: Any, where: str) -> EvaluationRound:
    fields = _Fields(obj, where)
    metrics = _scalars(fields.mapping("metrics"))
    return EvaluationRound(
        model_version=fields.integer("model_version"),
        epoch=fields.integer("epoch"),
        trigger=fields.text("trigger", optional=True) or "",
        loss=metrics.pop("loss", None),
        metrics=metrics,
    )


def _epoch_end(obj: Any, where: str) -> tuple[int, int] | None:
    """``(epoch, model version at its end)``; None for an epoch not ended."""
    fields = _Fields(obj, where)
    version = fields.integer("ended_at_version", optional=True)
    return None if version is None else (fields.integer("epoch"), version)


def _train_window(obj: Any, where: str) -> TrainWindow:
    fields = _Fields(obj, where)
    window = TrainWindow(
        min_model_version=fields.integer("min_model_version"),
        max_model_version=fields.integer("max_model_version"),
        examples=fields.integer("examples"),
        loss=fields.number("loss"),
        metrics=_scalars(fields.mapping("metrics")),
    )
    if window.min_model_version > window.max_model_version:
        raise InputError(
            f"{where}: 'min_model_version' must not exceed 'max_model_version', got {_show(obj)}"
        )
    return window


def _restart_event(obj: Any, where: str) -> RestartEvent:
    fields = _Fields(obj, where)
    return RestartEvent(
        at_s=fields.number("at_s"),
        instance=fields.text("instance"),
        role=fields.text("role"),
        reason=fields.text("reason"),
    )


def load_summary(model_dir: str) -> dict | None:
    """``model_dir``'s ``summary.json`` as written by ``train``, checked; None if it has none."""
    path = OutputLayout(model_dir).summary
    if not storage.exists(path):
        return None
    try:
        summary = json.loads(storage.read_text(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None
    TrainingSummary.parse(summary, where=path)
    return summary
