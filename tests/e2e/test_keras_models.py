"""Model definitions written as plain Keras code train through `elastic-step train`.

Each definition in keras_models/ trains with 2 workers and 1 PS to the expected accuracy.
Its model.keras then loads with keras.models.load_model, as a user would load it, and
evaluates at once; Keras's evaluate() and `elastic-step evaluate` agree with the job's last
evaluation, which measured the saved model, on the loss and on every metric.
"""

from __future__ import annotations

import csv
import importlib.util
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import keras
import pytest
import tensorflow as tf
from conftest import TrainRun, records_exact

from elastic_step.cli import main
from elastic_step.data.feed import make_dataset, records_dataset
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.evaluate import evaluate
from elastic_step.model.serving import raw_examples  # also registers RawFeatures for load_model

pytestmark = pytest.mark.e2e

KERAS_MODELS = Path(__file__).parent / "keras_models"


@dataclass(frozen=True, kw_only=True)
class Case:
    model_def: str
    data: str  # the fixture that preprocessed the data
    epochs: int
    min_accuracy: float
    #: Whether model() compiles the model, so that model.keras evaluates as it is loaded.
    compiled: bool
    #: Classes of the file that keras.models.load_model needs (a subclassed model).
    custom_objects: tuple[str, ...] = ()


CASES = [
    Case(
        model_def="compiled_functional.py",
        data="digits_data",
        epochs=3,
        min_accuracy=0.9,
        compiled=True,
    ),
    Case(
        model_def="compiled_sequential.py",
        data="digits_data",
        epochs=4,
        min_accuracy=0.85,
        compiled=True,
    ),
    Case(
        model_def="subclassed.py",
        data="digits_data",
        epochs=3,
        min_accuracy=0.9,
        compiled=False,
        custom_objects=("DigitsModel",),
    ),
    Case(
        model_def="per_example_loss.py",
        data="breast_cancer_data",
        epochs=4,
        min_accuracy=0.9,
        compiled=False,
    ),
]


@pytest.fixture(scope="module")
def breast_cancer_data(tmp_path_factory) -> Path:
    """scikit-learn's breast cancer set (569 rows, 30 columns c0..c29, label 0/1), preprocessed."""
    from sklearn.datasets import load_breast_cancer

    root = tmp_path_factory.mktemp("breast_cancer")
    cancer = load_breast_cancer()
    with open(root / "cancer.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"c{i}" for i in range(30)] + ["malignant"])
        for row, label in zip(cancer.data, cancer.target, strict=True):
            writer.writerow([*row.tolist(), int(label == 0)])
    args = ["preprocess", "--input", str(root / "cancer.csv"), "--label", "malignant"]
    assert main([*args, "--output", str(root / "data")]) == 0
    return root / "data"


def import_file(path: Path) -> types.ModuleType:
    """The model definition imported as a user's script would import it."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def validation_set(data: Path, module: types.ModuleType) -> tf.data.Dataset:
    """The validation split as model.keras takes it: through the definition's feed, or with
    the default feed as the records' raw values (model.keras then holds the preprocessing)."""
    schema = Schema.load(str(data))
    records = [
        record
        for shard, count in schema.shard_paths(str(data), "validation")
        for record in read_records(shard, 0, count)
    ]
    feed = getattr(module, "feed", None)
    dataset = make_dataset(records, batch_size=64, mode="evaluate", schema=schema, feed=feed)
    if feed is not None:
        return dataset
    raw = records_dataset(records, 64).map(lambda batch: raw_examples(batch, schema))
    return tf.data.Dataset.zip(raw, dataset.map(lambda features, labels: labels))


@pytest.mark.parametrize("case", CASES, ids=[c.model_def.removesuffix(".py") for c in CASES])
def test_a_keras_model_trains_and_its_model_keras_evaluates(case: Case, tmp_path, request):
    data = request.getfixturevalue(case.data)
    model_def = KERAS_MODELS / case.model_def
    output = tmp_path / "run"
    run = TrainRun(
        data, output, "--epochs", str(case.epochs), "--workers", "2", "--ps", "1",
        model_def=str(model_def),
    )  # fmt: skip
    try:
        code = run.start().wait(timeout=300)
    finally:
        run.kill_all()
    assert code == 0, run.log()[-3000:]
    summary = run.summary()
    assert records_exact(summary)
    trained = summary["metrics"]
    assert trained["accuracy"] >= case.min_accuracy, trained

    module = import_file(model_def)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.models.load_model(
            output / "model.keras",
            custom_objects={name: getattr(module, name) for name in case.custom_objects},
        )
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    assert model.compiled == case.compiled, "compile() settings are saved with the model"
    if not case.compiled:
        metrics = module.metrics() if callable(module.metrics) else module.metrics
        model.compile(loss=module.loss, metrics=metrics)
    measured = model.evaluate(validation_set(data, module), return_dict=True, verbose=0)
    assert set(measured) == set(trained), "the same loss and metrics, by the same names"
    for name, value in trained.items():
        assert measured[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate(
            model_dir=str(output),
            data_dir=str(data),
            split="validation",
            metrics_output=str(tmp_path / "metrics.json"),
        )
    assert not [w for w in caught if "Skipping variable loading" in str(w.message)]
    assert result["loss"] == pytest.approx(trained["loss"], rel=1e-4)
    for name, value in result["metrics"].items():
        assert value == pytest.approx(trained[name], rel=1e-4, abs=1e-6), name
