"""The HTML report: escaping of user text, the sections each kind of input gets, and one clear
error for malformed input. The browser's view of it is in tests/e2e/test_report_browser.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from elastic_step.errors import InputError
from elastic_step.report import load_summary, write_report
from elastic_step.report.page import (
    ROC_COLOR,
    TRAINING_COLOR,
    VALIDATION_COLOR,
    WORKERS_COLOR,
)
from elastic_step.report.svg_chart import nice_ticks

HOSTILE = "<script>alert('x')</script> & \"quoted\" <img src=x onerror=alert(1)>"


class Elements(HTMLParser):
    """The tags and attributes of a document, and its text, as a browser's parser sees them."""

    def __init__(self, document: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(document)

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data) -> None:
        self.text.append(data)

    def plots(self) -> list[str]:
        return [attrs["data-plot"] for _, attrs in self.tags if "data-plot" in attrs]

    def ids(self) -> set[str]:
        return {attrs["id"] for _, attrs in self.tags if "id" in attrs}

    def count(self, tag: str, **attrs: str) -> int:
        return sum(
            1
            for name, found in self.tags
            if name == tag and all(found.get(k.replace("_", "-")) == v for k, v in attrs.items())
        )


def binary_evaluation(labels: list[str]) -> dict:
    return {
        "split": "validation",
        "records": 100,
        "loss": 0.25,
        "metrics": {"accuracy": 0.9, "per_class": [0.8, 1.0]},
        "confusion_matrix": {
            "labels": labels,
            "rows": "true label",
            "columns": "predicted label",
            "matrix": [[40, 10], [0, 50]],
        },
        "roc": [
            {"threshold": 0.9, "tpr": 0.6, "fpr": 0.0},
            {"threshold": 0.5, "tpr": 1.0, "fpr": 0.2},
            {"threshold": 0.1, "tpr": 1.0, "fpr": 1.0},
        ],
    }


def summary(**overrides) -> dict:
    document = {
        "phase": "succeeded",
        "error": None,
        "model_def": "models/wine.py",
        "data": "s3://bucket/wine/",
        "written_at": "2026-11-27T12:00:00+00:00",
        "epochs": [
            {"epoch": e, "records_trained": 80, "records_expected": 80, "ended_at_version": 10 * e}
            for e in (1, 2)
        ],
        "metrics": {"loss": 0.25, "accuracy": 0.9},
        "evaluations": [
            {
                "round": 0,
                "epoch": 1,
                "trigger": "epoch-end",
                "model_version": 10,
                "metrics": {"loss": 0.5, "accuracy": 0.7},
            },
            {
                "round": 1,
                "epoch": 2,
                "trigger": "epoch-end",
                "model_version": 20,
                "metrics": {"loss": 0.25, "accuracy": 0.9},
            },
        ],
        "train_loss": [
            {
                "window": w,
                "min_model_version": 5 * w + 1,
                "max_model_version": 5 * w + 5,
                "examples": 160,
                "loss": 0.8 - 0.1 * w,
                # xent: a metric of the training windows only.
                "metrics": {"accuracy": 0.6 + 0.05 * w, "xent": 0.7 - 0.1 * w},
            }
            for w in range(4)
        ],
        "restarts": {"worker": 2, "ps": 0, "master": 0},
        "restarts_by_reason": {"crashed": 1, "preempted": 1},
        "restart_events": [
            {"at_s": 3.5, "instance": "worker-0", "role": "worker", "reason": "crashed"},
            {"at_s": 7.0, "instance": "worker-2", "role": "worker", "reason": "preempted"},
        ],
        "workers_timeline": [[0.0, 0], [1.0, 1], [1.2, 2], [3.5, 1], [4.0, 2], [7.0, 1]],
        "elapsed_s": 12.0,
        "examples_per_second": 850.5,
        "model_version": 20,
    }
    document.update(overrides)
    return document


def render(tmp_path: Path, evaluation: dict, training: dict | None) -> str:
    path = tmp_path / "out" / "report.html"  # its directory does not exist yet
    write_report(evaluation=evaluation, summary=training, path=str(path))
    return path.read_text()


def svgs(document: str) -> list[ET.Element]:
    """Each inline SVG, parsed as XML: escaping keeps it well-formed."""
    chunks = document.split("<svg ")[1:]
    return [ET.fromstring("<svg " + chunk.split("</svg>")[0] + "</svg>") for chunk in chunks]


def test_a_classifier_with_its_training_gets_every_plot(tmp_path) -> None:
    document = render(tmp_path, binary_evaluation(["benign", "malignant"]), summary())
    elements = Elements(document)

    assert elements.plots() == [
        "evaluation-loss",
        "evaluation-accuracy",
        "evaluation-xent",
        "workers",
        "confusion-matrix",
        "roc",
    ]
    assert {"evaluation-scalars", "training-facts", "evaluations", "workers", "confusion"} <= (
        elements.ids()
    )
    # Self-contained: nothing is loaded, nothing runs.
    assert not [tag for tag, attrs in elements.tags if tag in ("script", "link", "img", "iframe")]
    assert not [attrs for _, attrs in elements.tags if {"src", "href"} & set(attrs)]
    # One mark per restart, at its time; the legend counts them.
    assert elements.count("g", **{"class": "event", "data_kind": "crashed"}) == 1
    assert elements.count("g", **{"class": "event", "data_kind": "preempted"}) == 1
    text = " ".join(elements.text)
    assert "restarts of workers and PS (2;" in text
    # One card for the restarts, by role and by reason.
    assert "worker 2 (crashed 1, preempted 1)" in text and "by reason" not in text
    assert "850.5" in text and "12.0 s" in text
    # What was trained, on what, when.
    assert "models/wine.py" in text and "s3://bucket/wine/" in text
    assert "2026-11-27 12:00:00+00:00" in text
    # Each chart's series in the colours the legend names: the same in every chart.
    charts = [p for p in elements.plots() if p.startswith("evaluation-")]
    lines = [a["stroke"] for t, a in elements.tags if t == "polyline"]
    assert "olive</span>: training" in document and "blue</span>: validation" in document
    assert lines.count(ROC_COLOR) == 1  # the ROC curve's, and no validation line's
    assert set(lines) == {TRAINING_COLOR, VALIDATION_COLOR, WORKERS_COLOR, ROC_COLOR}
    # Every loss and metric chart marks where epochs 1 and 2 ended, at v10 and v20.
    assert elements.count("g", **{"class": "event", "data_kind": "epoch"}) == 2 * len(charts)
    assert "epoch 2 ended at model v20" in text and "e2" in text
    assert "ROC (positive class: malignant)" in text
    # (0, 0) then the three points: area 0.2 * 0.8 + 0.8 * 1.0 = 0.96.
    assert "3 thresholds; area under the plotted curve: 0.960" in text
    assert "per_class" in text and "[0.8, 1.0]" in text  # a list metric is shown, not plotted
    assert len(svgs(document)) == 5


def test_text_from_user_files_is_escaped_everywhere(tmp_path) -> None:
    evaluation = binary_evaluation([HOSTILE, "b&b"])
    evaluation["split"] = HOSTILE
    evaluation["metrics"] = {HOSTILE: 0.5}
    training = summary(
        error=HOSTILE,
        restart_events=[{"at_s": 1.0, "instance": HOSTILE, "role": "worker", "reason": HOSTILE}],
        restarts_by_reason={HOSTILE: 1},
    )
    training["evaluations"][0]["metrics"][HOSTILE] = 0.5
    document = render(tmp_path, evaluation, training)
    elements = Elements(document)

    assert not [tag for tag, _ in elements.tags if tag in ("script", "img")]
    assert not [a for _, attrs in elements.tags for a in attrs if a.startswith("on")]
    # The text reads as written: in the title, the header, the matrix, the plots.
    assert "".join(elements.text).count(HOSTILE) >= 8
    assert "b&b" in elements.text
    for svg in svgs(document):
        assert svg.get("data-plot") is not None


def test_a_regression_model_without_a_summary_gets_its_scalars_only(tmp_path) -> None:
    evaluation = {"split": "test", "records": 7, "loss": float("nan"), "metrics": {"mae": 1.5}}
    document = render(tmp_path, evaluation, None)
    elements = Elements(document)

    assert elements.plots() == []
    assert "no-summary" in elements.ids()
    assert not {"confusion", "roc", "workers", "evaluations"} & elements.ids()
    text = " ".join(elements.text)
    assert "nan" in text and "1.5" in text and "test" in text


def test_one_evaluation_an_empty_timeline_and_an_older_summary(tmp_path) -> None:
    training = summary(evaluations=summary()["evaluations"][:1], workers_timeline=[])
    for key in ("restart_events", "elapsed_s", "train_loss"):  # written by later versions only
        del training[key]
    document = render(tmp_path, binary_evaluation(["0", "1"]), training)
    elements = Elements(document)

    assert elements.plots() == ["evaluation-loss", "evaluation-accuracy", "confusion-matrix", "roc"]
    assert "No workers timeline was recorded." in elements.text
    assert "validation, 1 evaluation on the validation split while training" in " ".join(
        elements.text
    )
    # One point: a dot, no line, on an axis widened around it.
    [loss] = [svg for svg in svgs(document) if svg.get("data-plot") == "evaluation-loss"]
    ns = {"svg": "http://www.w3.org/2000/svg"}
    assert len(loss.findall(".//svg:circle", ns)) == 1
    assert loss.findall(".//svg:polyline", ns) == []


def test_training_windows_and_evaluations_share_each_metrics_chart(tmp_path) -> None:
    document = render(tmp_path, binary_evaluation(["0", "1"]), summary())
    ns = {"svg": "http://www.w3.org/2000/svg"}
    charts = {svg.get("data-plot"): svg for svg in svgs(document)}

    def points(plot: str) -> dict[str, list[str]]:
        return {
            g.get("data-series"): [
                c.find("svg:title", ns).text for c in g.findall("svg:circle", ns)
            ]
            for g in charts[plot].findall("svg:g[@class='series']", ns)
        }

    loss = points("evaluation-loss")
    assert list(loss) == ["training", "validation"]
    assert loss["training"][0] == "training, model v1-v5 (160 examples): loss 0.8"
    assert len(loss["training"]) == 4 and len(loss["validation"]) == 2
    assert loss["validation"][1] == "validation, model v20, epoch 2 (epoch-end): loss 0.25"
    assert list(points("evaluation-accuracy")) == ["training", "validation"]
    # A metric only the training windows have still gets its chart, with their series alone.
    assert list(points("evaluation-xent")) == ["training"]
    text = " ".join(Elements(document).text)
    assert "training, the mean over the batches trained in each window of model versions " in text
    assert "(4 windows)" in text


def test_a_summary_with_windows_but_no_evaluation_still_charts_the_training(tmp_path) -> None:
    document = render(tmp_path, binary_evaluation(["0", "1"]), summary(evaluations=[]))
    plots = Elements(document).plots()
    assert plots[:3] == ["evaluation-loss", "evaluation-accuracy", "evaluation-xent"]


def test_the_timeline_runs_to_the_end_of_the_job(tmp_path) -> None:
    document = render(tmp_path, binary_evaluation(["0", "1"]), summary())
    [workers] = [svg for svg in svgs(document) if svg.get("data-plot") == "workers"]
    ns = {"svg": "http://www.w3.org/2000/svg"}
    [line] = workers.findall(".//svg:polyline", ns)
    xs = [float(pair.split(",")[0]) for pair in line.get("points").split()]
    ys = [float(pair.split(",")[1]) for pair in line.get("points").split()]
    plot = workers.find(".//svg:rect", ns)
    right = float(plot.get("x")) + float(plot.get("width"))
    assert xs == sorted(xs) and xs[-1] == right  # elapsed_s is the right edge
    assert ys[-1] == ys[-2]  # one worker until the end: held, not joined to a later point


@pytest.mark.parametrize(
    ("evaluation", "training", "message"),
    [
        (
            {"split": "v", "records": 3, "metrics": {}},
            None,
            "evaluation: 'loss' is missing",
        ),
        (
            {
                **binary_evaluation(["a", "b"]),
                "confusion_matrix": {"labels": ["a", "b"], "matrix": [[1, 2], [3]]},
            },
            None,
            "evaluation: confusion_matrix: 'matrix' must be 2 rows of 2 counts, one per label, "
            "got [[1, 2], [3]]",
        ),
        (
            {**binary_evaluation(["a", "b"]), "roc": [{"threshold": 0.5, "tpr": 2, "fpr": 0}]},
            None,
            "evaluation: roc[0]: 'tpr' and 'fpr' must lie in [0, 1]",
        ),
        (
            binary_evaluation(["a", "b"]),
            summary(train_loss=[{"min_model_version": 1, "max_model_version": 5, "loss": 1.0}]),
            "summary: train_loss[0]: 'examples' is missing",
        ),
        (
            binary_evaluation(["a", "b"]),
            summary(
                train_loss=[
                    {"min_model_version": 9, "max_model_version": 5, "examples": 3, "loss": 1.0}
                ]
            ),
            "summary: train_loss[0]: 'min_model_version' must not exceed 'max_model_version'",
        ),
        (
            binary_evaluation(["a", "b"]),
            summary(workers_timeline=[[0.0, 0], [1.5]]),
            "summary: workers_timeline[1] must be [seconds, workers], got [1.5]",
        ),
        (
            binary_evaluation(["a", "b"]),
            summary(restarts_by_reason={"crashed": -1}),
            "summary: 'restarts_by_reason' must map names to counts, got {\"crashed\": -1}",
        ),
        (
            binary_evaluation(["a", "b"]),
            summary(evaluations=[{"epoch": 1, "metrics": {}}]),
            "summary: evaluations[0]: 'model_version' is missing",
        ),
    ],
)
def test_malformed_input_is_one_clear_error(tmp_path, evaluation, training, message) -> None:
    with pytest.raises(InputError) as error:
        write_report(evaluation=evaluation, summary=training, path=str(tmp_path / "r.html"))
    assert str(error.value).startswith(message)
    assert not (tmp_path / "r.html").exists()


def test_load_summary_reads_the_model_dirs_summary_and_names_a_bad_file(tmp_path) -> None:
    assert load_summary(str(tmp_path)) is None
    (tmp_path / "summary.json").write_text(json.dumps(summary()))
    assert load_summary(str(tmp_path)) == summary()
    (tmp_path / "summary.json").write_text('{"phase": "succeeded", ')
    with pytest.raises(InputError, match=rf"^{tmp_path}/summary.json: not valid JSON \("):
        load_summary(str(tmp_path))
    (tmp_path / "summary.json").write_text('{"restarts": [1]}')
    with pytest.raises(InputError, match=r"summary.json: 'restarts' must be an object, got \[1\]"):
        load_summary(str(tmp_path))


def test_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.1145, 0.2561) == [0.1, 0.15, 0.2, 0.25, 0.3]
    assert nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 3, integer=True) == [0, 1, 2, 3]
    assert nice_ticks(64, 144) == [60, 80, 100, 120, 140, 160]
