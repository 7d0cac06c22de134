"""The example KFP pipeline, whole, under kfp.local: preprocess -> elastic-train -> evaluate,
and batch-predict over the CSV.

One run on scikit-learn's breast cancer data (binary, so evaluate draws a ROC curve): the
real components in this environment (SubprocessRunner without a venv), the training step's
master with 2 worker and 1 PS processes, the prediction step's with 2 workers. The
assertions read what KFP's UI would read: each task's executor_output.json.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from example_data import write_breast_cancer_csv
from kfp import local

from elastic_step.examples import path_of
from pipelines.kfp_pipeline import elastic_step_pipeline

LABEL = "benign"
# kfp.local warns that the components' image does not look like a Python image: it runs them
# in this environment instead, which is the point.
pytestmark = pytest.mark.filterwarnings("ignore:You may be attemping:RuntimeWarning")


def executor_output(root: Path, task: str) -> dict:
    (path,) = root.glob(f"*/{task}/executor_output.json")
    return json.loads(path.read_text())


def artifact(output: dict, name: str) -> dict:
    return output["artifacts"][name]["artifacts"][0]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The run's folder: the CSV, and the pipeline root, root/."""
    work = tmp_path_factory.mktemp("kfp")
    write_breast_cancer_csv(work / "breast_cancer.csv", LABEL)
    return work


@pytest.fixture(scope="module")
def pipeline_run(work: Path) -> Path:
    """Runs the pipeline once; returns its pipeline root."""
    root = work / "root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    elastic_step_pipeline(
        csv_uri=str(work / "breast_cancer.csv"),
        label=LABEL,
        model_def_uri=path_of("breast_cancer"),
        epochs=2,
        batch_size=32,
        workers=2,
        max_workers=2,
        ps=1,
        records_per_task=64,
        backend="local",
    )
    return root


def test_preprocess_counts_the_records(pipeline_run: Path) -> None:
    data = artifact(executor_output(pipeline_run, "preprocess"), "data")
    metadata = data["metadata"]
    assert metadata["label"] == LABEL and metadata["label_kind"] == "class"
    assert metadata["columns"] == 30
    assert metadata["train_records"] + metadata["validation_records"] == 569
    assert (Path(data["uri"]) / "schema.json").is_file()


def test_training_writes_the_model_and_exact_accounting(pipeline_run: Path) -> None:
    train = executor_output(pipeline_run, "elastic-train")
    model = Path(artifact(train, "model")["uri"])
    assert (model / "model.keras").is_file()
    assert (model / "saved_model" / "saved_model.pb").is_file()
    summary = json.loads(Path(artifact(train, "summary")["uri"]).read_text())
    assert summary["phase"] == "succeeded"
    data = artifact(executor_output(pipeline_run, "preprocess"), "data")["metadata"]
    assert [e["records_trained"] for e in summary["epochs"]] == [data["train_records"]] * 2
    metrics = artifact(train, "metrics")["metadata"]
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["examples_per_second"] > 0
    job_name = train["parameterValues"]["job_name"]
    assert artifact(train, "model")["metadata"]["job_name"] == job_name
    assert job_name.startswith("es-")


def test_evaluation_feeds_the_kfp_ui(pipeline_run: Path) -> None:
    evaluation = executor_output(pipeline_run, "evaluate")
    scalars = artifact(evaluation, "metrics")["metadata"]
    assert scalars["accuracy"] > 0.8  # it learned: 63% of the records are benign
    assert scalars["loss"] > 0
    records = artifact(executor_output(pipeline_run, "preprocess"), "data")["metadata"][
        "validation_records"
    ]
    assert scalars["records"] == records
    # The model that evaluate loaded is the one whose final evaluation training reported.
    trained = artifact(executor_output(pipeline_run, "elastic-train"), "metrics")["metadata"]
    assert scalars["loss"] == pytest.approx(trained["loss"], rel=1e-4)
    classification = artifact(evaluation, "classification")["metadata"]
    matrix = classification["confusionMatrix"]
    data = Path(artifact(executor_output(pipeline_run, "preprocess"), "data")["uri"])
    labels = json.loads((data / "schema.json").read_text())["label_vocabulary"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == labels
    assert len(labels) == 2 and all(len(row["row"]) == 2 for row in matrix["rows"])
    assert sum(sum(row["row"]) for row in matrix["rows"]) == records
    curve = classification["confidenceMetrics"]
    assert len(curve) >= 2
    assert {"confidenceThreshold", "recall", "falsePositiveRate"} <= set(curve[0])
    points = sorted((p["falsePositiveRate"], p["recall"]) for p in curve)
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in itertools.pairwise(points))
    assert area == pytest.approx(scalars["auc"], abs=0.02)
    report = Path(artifact(evaluation, "report")["uri"])
    assert report.is_file() and "<html" in report.read_text().lower()


def test_batch_predict_gives_the_models_output_for_every_csv_row(work, pipeline_run) -> None:
    import keras

    import elastic_step.model.serving  # noqa: F401 - registers the raw-input layer for load_model

    predict = executor_output(pipeline_run, "batch-predict")
    predictions = artifact(predict, "predictions")
    with open(Path(predictions["uri"]) / "predictions.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    with open(work / "breast_cancer.csv", newline="") as f:
        records = list(csv.DictReader(f))
    # One row per CSV row, in order; one output column (a logit) and no class for 2 classes.
    assert header == ["index", "output"]
    assert [int(row[0]) for row in rows] == list(range(len(records))) == list(range(569))
    # The trained model's own outputs on the CSV's raw values.
    model_dir = Path(artifact(executor_output(pipeline_run, "elastic-train"), "model")["uri"])
    schema = json.loads((model_dir / "schema.json").read_text())
    features = {
        c["input_name"]: np.array([float(r[c["name"]]) for r in records], dtype=np.float32)
        for c in schema["columns"]
    }
    model = keras.models.load_model(model_dir / "model.keras")
    expected = np.asarray(model.predict(features, batch_size=256, verbose=0)).reshape(-1)
    assert np.allclose([float(row[1]) for row in rows], expected, atol=1e-4)
    metadata = predictions["metadata"]
    assert metadata["rows"] == 569 and metadata["columns"] == header
    assert "class_counts" not in metadata
    job_name = predict["parameterValues"]["job_name"]
    assert metadata["job_name"] == job_name and job_name.startswith("es-")
    train_job = executor_output(pipeline_run, "elastic-train")["parameterValues"]["job_name"]
    assert job_name != train_job
    summary = json.loads(Path(artifact(predict, "summary")["uri"]).read_text())
    assert summary["phase"] == "succeeded"
    assert summary["records"] == summary["records_predicted"] == 569
