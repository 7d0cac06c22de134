"""The evaluation report: one self-contained HTML file (inline CSS and SVG, no scripts).

It opens anywhere, an air-gapped cluster included: it loads nothing. Each plot carries a
stable ``data-plot`` attribute, each section a stable ``id``.
Tests: tests/unit/test_report.py; in a browser, tests/e2e/test_report_browser.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape
from typing import Any

from elastic_step.data import storage
from elastic_step.report.inputs import (
    ConfusionMatrix,
    Evaluation,
    EvaluationRound,
    RocPoint,
    TrainingSummary,
    TrainWindow,
)
from elastic_step.report.svg_chart import Chart, Event, Point, Series, render_chart

WORKERS_COLOR = "#1f77b4"
RESTART_COLOR = "#d62728"
ROC_COLOR = "#ff7f0e"
#: The two series of every loss and metric chart, the same in each, as the legend says.
TRAINING_COLOR = "#bcbd22"
VALIDATION_COLOR = "#1f77b4"
EPOCH_COLOR = "#888888"
#: Epoch marks are labelled ("e3") up to this many epochs; beyond, lines only.
LABELLED_EPOCHS = 30

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #222; background: #fff; margin: 0 auto; padding: 16px 24px; max-width: 1120px; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.note { color: #555; margin: 4px 0 8px; }
.error { color: #b00020; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 0; }
.cards div { border: 1px solid #ddd; border-radius: 6px; padding: 6px 12px; min-width: 96px; }
.cards dt { color: #555; font-size: 12px; }
.cards dd { margin: 0; font-size: 18px; font-variant-numeric: tabular-nums; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg.chart { max-width: 100%; height: auto; font-size: 11px; }
svg .chart-title { font-size: 13px; font-weight: 600; fill: #222; }
svg .plot-area { fill: #fafafa; stroke: #ccc; }
svg .grid { stroke: #e4e4e4; }
svg .tick { fill: #555; }
svg .axis-label { fill: #333; font-size: 12px; }
svg .line { fill: none; stroke-width: 2.5; stroke-linejoin: round; }
svg .diagonal { stroke: #999; stroke-dasharray: 4 4; }
svg .event line { stroke-width: 2.5; stroke-dasharray: 5 3; }
svg .event[data-kind="epoch"] line { stroke-width: 1; }
.scroll { overflow: auto; max-width: 100%; }
table.confusion { border-collapse: collapse; font-variant-numeric: tabular-nums; }
table.confusion th, table.confusion td { border: 1px solid #ddd; padding: 4px 8px; }
table.confusion td { text-align: right; min-width: 36px; }
table.confusion th { background: #f3f3f3; font-weight: 600; max-width: 160px;
  overflow-wrap: anywhere; }
"""


def write_report(*, evaluation: dict | None, summary: dict | None, path: str) -> None:
    """Writes the report of ``evaluation`` (what ``evaluate`` returns) to ``path``.

    ``summary`` is the training job's ``summary.json``; without it the report shows the
    evaluation only, and without ``evaluation`` the training only (the report the master
    leaves in --output). A malformed input is an :class:`InputError` naming the field.
    """
    document = render_report(
        evaluation=None if evaluation is None else Evaluation.parse(evaluation),
        summary=None if summary is None else TrainingSummary.parse(summary),
    )
    storage.makedirs(storage.parent(path))
    storage.write_text_atomic(path, document)


def render_report(*, evaluation: Evaluation | None, summary: TrainingSummary | None) -> str:
    """The report as one HTML document."""
    if evaluation is None:
        title = "elastic-step training"
        body = [f"<h1>{escape(title)}</h1>"]
    else:
        title = f"elastic-step evaluation: {evaluation.split} split"
        body = [f"<h1>{escape(title)}</h1>", _evaluation_header(evaluation)]
    if summary is None:
        body.append(
            '<p class="note" id="no-summary">No training summary: this report shows the '
            "evaluation only.</p>"
        )
    else:
        body += [
            _training_header(summary),
            _evaluations_section(summary.evaluations, summary.train_windows, summary.epoch_ends),
            _workers_section(summary),
        ]
    if evaluation is not None and evaluation.confusion_matrix is not None:
        body.append(_confusion_section(evaluation.confusion_matrix))
    if evaluation is not None and evaluation.roc:
        body.append(_roc_section(evaluation.roc, evaluation.confusion_matrix))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def _number(value: float | int | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _cards(section_id: str, items: list[tuple[str, str]]) -> str:
    cards = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in items)
    return f'<dl class="cards" id="{section_id}">{cards}</dl>'


def _evaluation_header(evaluation: Evaluation) -> str:
    items = [
        ("split", evaluation.split),
        ("records", _number(evaluation.records)),
        ("loss", _number(evaluation.loss)),
    ]
    items += [(name, _number(value)) for name, value in evaluation.metrics.items()]
    items += [(name, str(value)) for name, value in evaluation.other_metrics.items()]
    return _cards("evaluation-scalars", items)


def _restarts(summary: TrainingSummary) -> str:
    """One line for both counts: by role, then (by reason), e.g. "worker 2 (killed 2)"."""
    by_role = ", ".join(f"{role} {n}" for role, n in summary.restarts.items() if n)
    if not by_role:
        return "none"
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(summary.restarts_by_reason.items()) if n)
    return f"{by_role} ({reasons})" if reasons else by_role


def _training_header(summary: TrainingSummary) -> str:
    names = [
        (label, value)
        for label, value in (
            ("model", summary.model_def),
            ("data", summary.data),
            ("date", summary.written_at and summary.written_at.replace("T", " ")),
        )
        if value
    ]
    items = [
        *names,
        ("job", summary.phase),
        ("epochs", _number(summary.epochs)),
        ("most live workers", _number(max((n for _, n in summary.workers_timeline), default=0))),
        ("restarts", _restarts(summary)),
        ("examples/s", _number(summary.examples_per_second)),
        ("final model version", _number(summary.model_version)),
    ]
    if summary.elapsed_s is not None:
        items.append(("elapsed", f"{summary.elapsed_s:,.1f} s"))
    error = f'<p class="error">{escape(summary.error)}</p>' if summary.error else ""
    return f"<h2>Training</h2>\n{_cards('training-facts', items)}\n{error}"


def _points(entries: list, name: str, where: Callable[[Any], tuple[int, str]]) -> list[Point]:
    """A point for each of ``entries`` (training windows or evaluation rounds) that reports
    ``name`` (the loss or a metric); ``where(entry)`` gives its x and what its tooltip says
    before the value."""
    points = []
    for entry in entries:
        y = entry.loss if name == "loss" else entry.metrics.get(name)
        if y is not None:
            x, what = where(entry)
            points.append(Point(x=x, y=y, tooltip=f"{what}: {name} {_number(y)}"))
    return points


def _evaluations_section(
    rounds: list[EvaluationRound], windows: list[TrainWindow], epoch_ends: list[tuple[int, int]]
) -> str:
    head = '<section id="evaluations">\n<h2>Loss and metrics by model version</h2>'
    if not rounds and not windows:
        return (
            f'{head}\n<p class="note">No evaluation ran and no training loss was reported.</p>'
            "\n</section>"
        )
    rounds = sorted(rounds, key=lambda r: (r.model_version, r.epoch))
    names = list(dict.fromkeys(name for r in rounds + windows for name in r.metrics))
    labelled = len(epoch_ends) <= LABELLED_EPOCHS
    marks = [
        Event(
            x=version,
            tooltip=f"epoch {epoch} ended at model v{version}",
            kind="epoch",
            label=f"e{epoch}" if labelled else "",
        )
        for epoch, version in epoch_ends
    ]
    charts = []
    for name in ["loss", *names]:
        training = _points(
            windows,
            name,
            lambda w: (
                w.max_model_version,
                f"training, model v{w.min_model_version}-v{w.max_model_version} "
                f"({w.examples:,} examples)",
            ),
        )
        validation = _points(
            rounds,
            name,
            lambda r: (
                r.model_version,
                f"validation, model v{r.model_version}, epoch {r.epoch} ({r.trigger})",
            ),
        )
        series = [
            Series(name=label, points=points, color=color)
            for label, points, color in (
                ("training", training, TRAINING_COLOR),
                ("validation", validation, VALIDATION_COLOR),
            )
            if points
        ]
        if not series:
            continue
        chart = Chart(
            title=name,
            x_label="model version",
            y_label=name,
            series=series,
            events=marks,
            event_color=EPOCH_COLOR,
        )
        charts.append(render_chart(chart, plot_id=f"evaluation-{name}"))
    counts = []
    if windows:
        counts.append(
            f'<span style="color:{TRAINING_COLOR}">&#9679; olive</span>: training, the mean over '
            f"the batches trained in each window of model versions ({len(windows)} "
            f"window{'s' if len(windows) > 1 else ''})"
        )
    if rounds:
        counts.append(
            f'<span style="color:{VALIDATION_COLOR}">&#9679; blue</span>: validation, '
            f"{len(rounds)} evaluation{'s' if len(rounds) > 1 else ''} on the validation split "
            "while training"
        )
    if marks:
        counts.append(
            f'<span style="color:{EPOCH_COLOR}">dashed lines</span>: where each epoch ended'
            + (" (e1 is epoch 1)" if labelled else "")
        )
    note = f'<p class="note">{"; ".join(counts)}.</p>'
    return f'{head}\n{note}\n<div class="charts">\n' + "\n".join(charts) + "\n</div>\n</section>"


def _workers_section(summary: TrainingSummary) -> str:
    head = '<section id="workers">\n<h2>Live workers</h2>'
    timeline = summary.workers_timeline
    if not timeline:
        return f'{head}\n<p class="note">No workers timeline was recorded.</p>\n</section>'
    points = [Point(x=t, y=n, tooltip=f"{t:,.1f} s: {n} running") for t, n in timeline]
    end = max([t for t, _ in timeline] + [e.at_s for e in summary.restart_events])
    if summary.elapsed_s is not None and summary.elapsed_s > end:
        end = summary.elapsed_s
        points.append(Point(x=end, y=timeline[-1][1], tooltip=f"{end:,.1f} s: the summary"))
    events = [
        Event(
            x=e.at_s,
            tooltip=f"{e.at_s:,.1f} s: {e.instance} ({e.role}) {e.reason}, replaced",
            kind=e.reason,
        )
        for e in summary.restart_events
    ]
    chart = Chart(
        title="running workers",
        x_label="seconds since the job started",
        y_label="workers",
        series=[Series(name="workers", points=points, color=WORKERS_COLOR, step=True)],
        events=events,
        event_color=RESTART_COLOR,
        x_range=(0.0, end or 1.0),
        y_range=(0.0, max(1, max(n for _, n in timeline))),
        integer_y=True,
        width=1000,
    )
    if events:
        legend = (
            f'<p class="note"><span style="color:{RESTART_COLOR}">&#9660; dashed lines</span>: '
            f"restarts of workers and PS ({len(events)}; point at one for its instance and "
            "reason).</p>"
        )
    else:
        legend = '<p class="note">No worker or PS was restarted.</p>'
    return f"{head}\n{legend}\n{render_chart(chart, plot_id='workers')}\n</section>"


def _cell_color(share: float) -> tuple[str, str]:
    """Background and text color of a cell holding ``share`` of its row: white to blue."""
    low, high = (247, 251, 255), (8, 48, 107)
    rgb = [round(a + (b - a) * share) for a, b in zip(low, high, strict=True)]
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})", "#fff" if share > 0.5 else "#222"


def _confusion_section(matrix: ConfusionMatrix) -> str:
    labels = [escape(label) for label in matrix.labels]
    rows_name, columns_name = escape(matrix.rows), escape(matrix.columns)
    header = "".join(f'<th scope="col">{label}</th>' for label in labels)
    body = []
    for label, counts in zip(labels, matrix.counts, strict=True):
        total = sum(counts)
        cells = []
        for predicted, count in zip(labels, counts, strict=True):
            share = count / total if total else 0.0
            background, color = _cell_color(share)
            cells.append(
                f'<td style="background:{background};color:{color}" '
                f'title="{rows_name} {label}, {columns_name} {predicted}: {count:,} '
                f'({share:.0%} of the row)">{count:,}</td>'
            )
        body.append(f'<tr><th scope="row">{label}</th>{"".join(cells)}</tr>')
    return (
        '<section id="confusion">\n<h2>Confusion matrix</h2>\n'
        f'<p class="note">Rows: {rows_name}; columns: {columns_name}. '
        "The shade is the cell's share of its row.</p>\n"
        '<div class="scroll"><table class="confusion" data-plot="confusion-matrix">\n'
        f'<thead><tr><th scope="col">{rows_name} \\ {columns_name}</th>{header}</tr></thead>\n'
        f"<tbody>\n{chr(10).join(body)}\n</tbody></table></div>\n</section>"
    )


def _roc_section(roc: list[RocPoint], matrix: ConfusionMatrix | None) -> str:
    curve = sorted(roc, key=lambda p: (p.fpr, p.tpr))
    points = [Point(x=0.0, y=0.0)] + [
        Point(
            x=p.fpr,
            y=p.tpr,
            tooltip=f"threshold {p.threshold:.4g}: recall {p.tpr:.3f}, false positive rate "
            f"{p.fpr:.3f}",
        )
        for p in curve
    ]
    xs, ys = [p.x for p in points], [p.y for p in points]
    area = sum((xs[i] - xs[i - 1]) * (ys[i] + ys[i - 1]) / 2 for i in range(1, len(points)))
    positive = (
        f" (positive class: {matrix.labels[1]})" if matrix and len(matrix.labels) == 2 else ""
    )
    chart = Chart(
        title=f"ROC{positive}",
        x_label="false positive rate",
        y_label="true positive rate (recall)",
        series=[Series(name="roc", points=points, color=ROC_COLOR)],
        x_range=(0.0, 1.0),
        y_range=(0.0, 1.0),
        diagonal=True,
        width=420,
        height=400,
    )
    return (
        '<section id="roc">\n<h2>ROC curve</h2>\n'
        f'<p class="note">{len(roc)} thresholds; area under the plotted curve: {area:.3f}. '
        "The dashed line is a classifier that guesses.</p>\n"
        f"{render_chart(chart, plot_id='roc')}\n</section>"
    )
