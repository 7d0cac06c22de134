"""The saved model serves raw CSV values: a classifier with a categorical column and empty
numeric cells (--fill-missing mean), and a regressor on scikit-learn's diabetes, each trained
by a real job; their SavedModel signatures and model.keras checked against the evaluation
path (the default feed on the validation records, and the master's own evaluation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TrainRun, records_exact

import elastic_step.model.serving
from elastic_step.data.feed import default_feed_for_model, make_dataset
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records

pytestmark = pytest.mark.e2e

CLASSIFIER = """
import keras

def model():
    city = keras.Input(shape=(), dtype="int64", name="city")
    size = keras.Input(shape=(), name="size")
    weight = keras.Input(shape=(), name="weight_in_kg")
    numbers = keras.layers.Concatenate()(
        [keras.layers.Reshape((1,))(size), keras.layers.Reshape((1,))(weight)]
    )
    hidden = keras.layers.Concatenate()([keras.layers.Embedding(NUM_IDS, 3)(city), numbers])
    hidden = keras.layers.Dense(16, activation="relu")(hidden)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = keras.Model({"city": city, "size": size, "weight_in_kg": weight}, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.03), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
"""

REGRESSOR = """
import keras

def model():
    model = keras.Sequential([
        keras.Input(shape=(10,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model
"""

CITIES = ["Paris", "Lyon", "Nice", ""]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "elastic_step", *args], capture_output=True, text=True, timeout=300
    )


def classifier_csv(path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = ["city,size,weight in kg,tier"]
    for i in range(480):
        city = CITIES[rng.integers(4)]
        size = rng.normal(5, 2)
        tier = ["low", "mid", "high"][int(size > 4) + int(city == "Paris")]
        size_cell = "" if i % 7 == 0 else f"{size:.3f}"
        weight_cell = "" if i % 5 == 0 else f"{rng.normal(70, 10):.2f}"
        rows.append(f"{city},{size_cell},{weight_cell},{tier}")
    path.write_text("\n".join(rows) + "\n")


def diabetes_csv(path: Path) -> None:
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True, scaled=False).frame
    frame.to_csv(path, index=False)


def train(root: Path, csv: Path, label: str, model_def: str, *prep: str) -> tuple[Path, Path]:
    data, output = root / "data", root / "run"
    result = run_cli("preprocess", "--input", str(csv), "--label", label, "--output", str(data),
                     *prep)  # fmt: skip
    assert result.returncode == 0, result.stderr
    schema = Schema.load(str(data))
    num_ids = {c.name: c.num_ids for c in schema.columns if c.kind == "categorical"}
    (root / "model.py").write_text(model_def.replace("NUM_IDS", str(num_ids.get("city"))))
    run = TrainRun(data, output, "--epochs", "2", "--workers", "1", "--ps", "1",
                   model_def=str(root / "model.py"))  # fmt: skip
    try:
        code = run.start().wait(timeout=300)
    finally:
        run.kill_all()
    assert code == 0, run.log()[-3000:]
    assert records_exact(run.summary())
    return data, output


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("classifier")
    classifier_csv(root / "rows.csv")
    return train(root, root / "rows.csv", "tier", CLASSIFIER, "--fill-missing", "mean")


@pytest.fixture(scope="module")
def regressor(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("regressor")
    diabetes_csv(root / "diabetes.csv")
    return train(root, root / "diabetes.csv", "target", REGRESSOR)


def validation_records(data: Path) -> tuple[Schema, list[bytes]]:
    schema = Schema.load(str(data))
    records = [r for path, n in schema.shard_paths(str(data), "validation")
               for r in read_records(path, 0, n)]  # fmt: skip
    return schema, records


def evaluation_path(output: Path, schema: Schema, records: list[bytes]):
    """What evaluation computes on ``records``: the default feed, then the trained model (the
    raw-input model's last layer), with the labels."""
    raw_model = keras.models.load_model(output / "model.keras")
    trained = raw_model.layers[-1]
    ((features, labels),) = list(
        make_dataset(records, batch_size=len(records), mode="evaluate", schema=schema,
                     feed=default_feed_for_model(trained))
    )  # fmt: skip
    return raw_model, trained(features, training=False).numpy(), labels.numpy()


def example(values: dict) -> bytes:
    """A raw tf.train.Example: floats and strings; a None value is left out (an empty cell)."""
    feature = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        else:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_classifier_serves_raw_examples_as_evaluation_does(classifier):
    data, output = classifier
    schema, records = validation_records(data)
    raw_model, expected, labels = evaluation_path(output, schema, records)
    served = tf.saved_model.load(str(output / "saved_model"))
    assert set(served.signatures) == {"serving_default", "predict_raw"}

    # The validation records are raw tf.train.Examples, as preprocess wrote them.
    result = served.signatures["serving_default"](examples=tf.constant(records))
    probabilities = result["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    class_ids = np.argmax(expected, axis=1)
    assert (result["class_ids"].numpy() == class_ids).all()
    names = [c.decode() for c in result["classes"].numpy()]
    assert names == [schema.label_vocabulary[i] for i in class_ids]
    assert set(names) <= {"low", "mid", "high"}

    # The master's evaluation of the final model, from the served probabilities.
    final = json.loads((output / "summary.json").read_text())["metrics"]
    picked = probabilities[np.arange(len(labels)), labels]
    assert np.mean(-np.log(picked)) == pytest.approx(final["loss"], abs=1e-5)
    assert np.mean(class_ids == labels) == pytest.approx(final["accuracy"], abs=1e-6)

    # predict_raw and model.keras on the same rows as raw tensors: NaN for an empty number.
    raw = elastic_step.model.serving.raw_examples(tf.constant(records), schema)
    assert np.isnan(raw["size"].numpy()).any() and (raw["city"].numpy() == b"").any()
    by_raw = served.signatures["predict_raw"](**raw)
    np.testing.assert_allclose(by_raw["probabilities"].numpy(), expected, atol=1e-5)
    assert list(by_raw["classes"].numpy()) == list(result["classes"].numpy())
    from_keras = raw_model.predict(raw, verbose=0)
    np.testing.assert_allclose(from_keras, expected, atol=1e-5)


def test_classifier_reads_unseen_categories_and_empty_cells_as_training_does(classifier):
    data, output = classifier
    schema = Schema.load(str(data))
    size, weight = schema.feature("size"), schema.feature("weight in kg")
    served = tf.saved_model.load(str(output / "saved_model")).signatures["serving_default"]
    rows = [
        {"city": "Atlantis", "size": 6.0, "weight in kg": 80.0},  # a city never seen
        {"city": "Paris", "size": None, "weight in kg": None},  # empty numeric cells
        {"city": "  Lyon ", "size": 3.0, "weight in kg": 60.0},  # spaces, as in a CSV cell
        {"size": 3.0, "weight in kg": 60.0},  # no city: an empty cell
    ]
    got = served(examples=tf.constant([example(r) for r in rows]))["probabilities"].numpy()

    # The same rows encoded by hand as the default feed encodes them.
    trained = keras.models.load_model(output / "model.keras").layers[-1]
    unknown = schema.feature("city").vocabulary_size

    def encoded(city_id: int, size_value: float, weight_value: float) -> dict:
        return {
            "city": np.array([city_id]),
            "size": np.array([(size_value - size.mean) / size.std], np.float32),
            "weight_in_kg": np.array([(weight_value - weight.mean) / weight.std], np.float32),
        }

    vocabulary = schema.vocabulary(schema.feature("city"))
    expected = [
        encoded(unknown, 6.0, 80.0),
        encoded(vocabulary.index("Paris"), size.fill, weight.fill),
        encoded(vocabulary.index("Lyon"), 3.0, 60.0),
        encoded(vocabulary.index(""), 3.0, 60.0),
    ]
    for row, features, probabilities in zip(rows, expected, got, strict=True):
        want = trained(features, training=False).numpy()[0]
        np.testing.assert_allclose(probabilities, want, atol=1e-5, err_msg=str(row))
    assert size.fill == pytest.approx(size.mean) and weight.fill == pytest.approx(weight.mean)


def test_regressor_serves_raw_diabetes_rows_as_evaluation_does(regressor):
    data, output = regressor
    schema, records = validation_records(data)
    raw_model, expected, labels = evaluation_path(output, schema, records)
    served = tf.saved_model.load(str(output / "saved_model"))
    result = served.signatures["serving_default"](examples=tf.constant(records))
    assert set(result) == {"predictions"}
    predictions = result["predictions"].numpy()
    assert predictions.shape == (len(records),)
    np.testing.assert_allclose(predictions, expected[:, 0], rtol=1e-5, atol=1e-4)
    final = json.loads((output / "summary.json").read_text())["metrics"]
    squared = np.mean((predictions.astype(np.float64) - labels) ** 2)
    assert squared == pytest.approx(final["loss"], rel=1e-5)

    # Raw rows straight from the CSV's values, not standardized by hand (the case).
    raw = elastic_step.model.serving.raw_examples(tf.constant(records), schema)
    by_raw = served.signatures["predict_raw"](**raw)["predictions"].numpy()
    np.testing.assert_allclose(by_raw, predictions, rtol=1e-5, atol=1e-4)
    from_keras = raw_model.predict(raw, verbose=0)
    np.testing.assert_allclose(from_keras[:, 0], predictions, rtol=1e-5, atol=1e-4)
