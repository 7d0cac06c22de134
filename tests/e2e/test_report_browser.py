"""The report as its reader sees it: a binary classifier trained through a worker crash,
evaluated by `elastic-step evaluate --report`, opened in headless Chromium.

Chromium is driven over the DevTools protocol (tests/headless_chromium.py): from the
first load on it reports console errors, exceptions and every request, and it gives the
plots' boxes from the DOM and a screenshot of the same page. The screenshot is checked
pixel by pixel: each plot's own marks (its curve's color, the restarts' color, the darkest
cell of the matrix) are drawn inside that plot's box.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import TrainRun, mid_epoch
from headless_chromium import HeadlessChromium, pixels_of

from elastic_step.cli import main

pytestmark = pytest.mark.e2e

COLUMNS = [f"x{i}" for i in range(30)]
#: The classes as the CSV spells them, sorted as preprocess orders them: class 1 is positive.
LABELS = ["<b>malignant</b>", 'benign & "co"']

MODEL_DEF = f"""
import keras

COLUMNS = {COLUMNS!r}


def model():
    inputs = {{n: keras.Input(shape=(), name=n) for n in COLUMNS}}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in COLUMNS])
    x = keras.layers.Dense(8, activation="relu")(x)
    probability = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(inputs, keras.layers.Reshape(())(probability))


def loss(labels, outputs):
    labels = keras.ops.cast(labels, "float32")
    return keras.ops.mean(keras.losses.binary_crossentropy(labels, outputs))


def optimizer():
    return keras.optimizers.Adam(0.01)


def metrics():
    return {{
        "accuracy": keras.metrics.BinaryAccuracy(),
        "auc": keras.metrics.AUC(num_thresholds=2000),
    }}
"""

WIDTH = 1200
#: What the page shows, in order, for a binary classifier with its training summary.
PLOTS = [
    "evaluation-loss",
    "evaluation-accuracy",
    "evaluation-auc",
    "workers",
    "confusion-matrix",
    "roc",
]

#: Each plot's box, the color of its main mark, and its restart marks, read from the DOM.
REGIONS_JS = """
(() => {
  const brightness = (color) => color.match(/\\d+/g).slice(0, 3).reduce((a, b) => a + +b, 0);
  return [...document.querySelectorAll('[data-plot]')].map((el) => {
    const box = el.getBoundingClientRect();
    let mark;
    if (el.tagName === 'TABLE') {
      const colors = [...el.querySelectorAll('td')]
        .map((td) => getComputedStyle(td).backgroundColor);
      mark = colors.sort((a, b) => brightness(a) - brightness(b))[0];
    } else {
      const line = el.querySelector('.series polyline');
      mark = line ? getComputedStyle(line).stroke
                  : getComputedStyle(el.querySelector('.series circle')).fill;
    }
    const events = [...el.querySelectorAll('.event')];
    const series = [...el.querySelectorAll('.series')].map((g) => {
      const line = g.querySelector('polyline');
      return {
        name: g.dataset.series,
        circles: g.querySelectorAll('circle').length,
        color: line ? getComputedStyle(line).stroke
                    : getComputedStyle(g.querySelector('circle')).fill,
      };
    });
    return {
      series,
      plot: el.dataset.plot,
      x: box.left + scrollX, y: box.top + scrollY, width: box.width, height: box.height,
      mark,
      events: events.map((g) => g.dataset.kind),
      event_mark: events.length ? getComputedStyle(events[0].querySelector('line')).stroke : null,
    };
  });
})()
"""


def write_breast_cancer_csv(path: Path) -> None:
    """scikit-learn's bundled breast cancer data (569 rows), labels spelled as HTML."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*COLUMNS, "diagnosis"])
        for features, target in zip(data.data, data.target, strict=True):
            # sklearn's target 0 is malignant, 1 benign.
            writer.writerow([*features, LABELS[target]])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """The data and the training output of a run whose worker was killed mid-epoch."""
    from elastic_step.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("breast-cancer")
    write_breast_cancer_csv(root / "data.csv")
    preprocess(input_path=str(root / "data.csv"), label="diagnosis", output=str(root / "data"))
    (root / "model.py").write_text(MODEL_DEF)
    run = TrainRun(
        root / "data",
        root / "run",
        # Enough epochs that the job is still running when the test looks for mid-epoch:
        # 8 could end in 3 s.
        *("--epochs", "16", "--workers", "2", "--ps", "1"),
        model_def=str(root / "model.py"),
    ).start()
    try:
        with run.held(mid_epoch) as status:
            victim = next(m for m in status["workers"] if m["state"] == "running")
            os.kill(victim["pid"], signal.SIGKILL)
        assert run.wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    return root / "data", run.output


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory) -> tuple[Path, dict, dict]:
    """`elastic-step evaluate --report`: the report's path, the metrics and the summary."""
    data, output = trained
    out = tmp_path_factory.mktemp("evaluated")
    report = out / "reports" / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "evaluate", "--model", str(output),
         "--data", str(data), "--metrics-output", str(out / "metrics.json"),
         "--report", str(report)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"wrote the report: {report}" in result.stderr
    assert "roc" not in json.loads(result.stdout)  # printed without its 100 points
    metrics = json.loads((out / "metrics.json").read_text())
    return report, metrics, json.loads((output / "summary.json").read_text())


def test_evaluate_gives_the_roc_curve_of_a_binary_classifier(evaluated) -> None:
    _, metrics, summary = evaluated
    roc = metrics["roc"]
    assert 10 < len(roc) <= 100
    assert metrics["confusion_matrix"]["labels"] == LABELS
    thresholds = [p["threshold"] for p in roc]
    assert thresholds == sorted(thresholds, reverse=True) and 0 <= thresholds[-1] <= 1
    assert (roc[-1]["tpr"], roc[-1]["fpr"]) == (1.0, 1.0)
    # The area under the points agrees with Keras's own AUC metric of the same model.
    fpr = [0.0] + [p["fpr"] for p in roc]
    tpr = [0.0] + [p["tpr"] for p in roc]
    assert np.trapezoid(tpr, fpr) == pytest.approx(metrics["metrics"]["auc"], abs=0.01)
    assert metrics["metrics"]["auc"] > 0.9
    # The confusion matrix is the 0.5 threshold's point.
    [[true_negatives, _], [_, true_positives]] = metrics["confusion_matrix"]["matrix"]
    assert (true_negatives + true_positives) / metrics["records"] == pytest.approx(
        metrics["metrics"]["accuracy"], abs=1e-6
    )
    # The summary says when the killed worker was replaced.
    [crash] = [e for e in summary["restart_events"] if e["reason"] == "crashed"]
    assert crash["role"] == "worker" and 0 < crash["at_s"] < summary["elapsed_s"]
    assert any(t == pytest.approx(crash["at_s"], abs=0.5) for t, _ in summary["workers_timeline"])


def test_the_report_renders_in_chromium_with_every_plot_drawn(evaluated, trained, tmp_path) -> None:
    import tensorflow as tf

    report, _, summary = evaluated
    browser = HeadlessChromium(tmp_path / "profile", width=WIDTH, height=900)
    try:
        browser.load(report.as_uri())
        regions = browser.evaluate(REGIONS_JS)
        height = browser.evaluate("document.documentElement.scrollHeight")
        png = browser.screenshot(width=WIDTH, height=height)
        dom = browser.evaluate(
            """({title: document.title,
                 active: document.querySelectorAll('script, img, iframe, object').length,
                 labels: [...document.querySelectorAll('table.confusion thead th')]
                   .map((th) => th.textContent),
                 legend: Object.fromEntries(
                   [...document.querySelectorAll('#evaluations .note span')]
                   .map((s) => [s.textContent, getComputedStyle(s).color]))})"""
        )
        errors, requests = browser.errors(), browser.requests()
        # The master's own report of the same training, beside the model.
        report_of_training = trained[1] / "report.html"
        browser.load(report_of_training.as_uri())
        training = browser.evaluate(
            """({title: document.title,
                 plots: [...document.querySelectorAll('[data-plot]')].map((e) => e.dataset.plot),
                 text: document.body.innerText})"""
        )
        errors += browser.errors()
    finally:
        browser.close()
    (tmp_path / "report.png").write_bytes(png)  # kept for a look when the test fails

    assert errors == []
    assert requests == [report.as_uri()]  # self-contained: nothing else is fetched
    assert training["title"] == "elastic-step training", report_of_training
    assert training["plots"] == [p for p in PLOTS if p not in ("confusion-matrix", "roc")]
    assert summary["model_def"] in training["text"] and summary["data"] in training["text"]
    assert dom["title"] == "elastic-step evaluation: validation split"
    assert dom["active"] == 0
    assert dom["labels"][1:] == LABELS  # the HTML in the labels shows as text
    assert [r["plot"] for r in regions] == PLOTS

    image = tf.io.decode_png(png, channels=3).numpy().astype(int)
    assert image.shape == (height, WIDTH, 3)
    assert image.std() > 20, "the screenshot is blank"
    for region in regions:
        assert region["width"] > 100 and region["height"] > 100, region
        assert region["y"] + region["height"] <= height, region
        drawn = pixels_of(image, region, region["mark"])
        assert drawn >= 150, f"{region['plot']}: {drawn} pixels of {region['mark']}"
    # Each metric's chart draws the training windows and the evaluation rounds, each series
    # in its own colour, one mark per window or round.
    windows, rounds = summary["train_loss"], summary["evaluations"]
    assert len(windows) >= 2 and len(rounds) >= 2
    for region in regions:
        if not region["plot"].startswith("evaluation-"):
            continue
        name = region["plot"].removeprefix("evaluation-")
        series = {s["name"]: s for s in region["series"]}
        assert list(series) == ["training", "validation"], name
        assert series["validation"]["circles"] == len(rounds), region
        assert series["training"]["circles"] == len(windows), region
        assert series["training"]["color"] != series["validation"]["color"]
        # The legend names each series in the colour it is drawn in, in every chart.
        assert dom["legend"]["\u25cf olive"] == series["training"]["color"], name
        assert dom["legend"]["\u25cf blue"] == series["validation"]["color"], name
        # A mark where each epoch ended.
        assert region["events"] == ["epoch"] * len(summary["epochs"]), name
        for s in series.values():
            drawn = pixels_of(image, region, s["color"])
            assert drawn >= 100, f"{region['plot']} {s['name']}: {drawn} pixels of {s['color']}"
    [workers] = [r for r in regions if r["plot"] == "workers"]
    assert "crashed" in workers["events"]
    assert pixels_of(image, workers, workers["event_mark"]) >= 50


def test_a_malformed_summary_is_one_error_before_anything_is_evaluated(
    trained, tmp_path, capsys
) -> None:
    data, output = trained
    model = tmp_path / "model"
    shutil.copytree(output, model, ignore=shutil.ignore_patterns("master-state", "checkpoints"))
    (model / "summary.json").write_text('{"workers_timeline": [[0.0, "two"]]}')
    argv = ["evaluate", "--model", str(model), "--data", str(data),
            "--metrics-output", str(tmp_path / "metrics.json"),
            "--report", str(tmp_path / "report.html")]  # fmt: skip

    assert main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"elastic-step: error: {model}/summary.json: workers_timeline[0] must be "
        '[seconds, workers], got [0.0, "two"]'
    ]
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "report.html").exists()
