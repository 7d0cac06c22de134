"""A plain Keras Sequential over one vector input, on the default feed, from a CSV whose column
names Keras would refuse and whose numeric cells are sometimes empty (--fill-missing mean)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runs import evaluate, mlp_classifier, run_cli, train_summary, write_job_inputs

pytestmark = pytest.mark.e2e

# 3 numeric columns, and a categorical one as one-hot over 3 regions + the unseen id.
WIDTH = 3 + 4

MODEL = mlp_classifier(WIDTH, 16, 3, optimizer="keras.optimizers.Adam(0.02)", accuracy=True)


def test_sequential_vector_model_with_missing_values(tmp_path):
    rng = np.random.default_rng(0)
    rows = ["fixed acidity,od280/od315_of_diluted_wines,color intensity,region,cultivar"]
    for i in range(600):
        cultivar = i % 3
        # Acidity is noise, and empty in one row of eight; the other two columns tell.
        acidity = "" if i % 8 == 0 else f"{rng.normal(8, 1):.3f}"
        od = rng.normal(1.5 + cultivar, 0.25)
        color = rng.normal(3 + 2 * cultivar, 0.5)
        region = ["north", "south", "east"][rng.integers(3)]
        rows.append(f"{acidity},{od:.4f},{color:.4f},{region},{cultivar}")
    csv, data, run = write_job_inputs(tmp_path, "wine.csv", rows, MODEL)

    prep = run_cli("preprocess", "--input", str(csv), "--label", "cultivar",
                   "--output", str(data), "--fill-missing", "mean", "--one-hot")  # fmt: skip
    assert prep.returncode == 0, prep.stderr
    assert (
        "Keras input names: 'fixed acidity' -> 'fixed_acidity', 'od280/od315_of_diluted_wines' "
        "-> 'od280_od315_of_diluted_wines', 'color intensity' -> 'color_intensity'"
    ) in prep.stderr
    schema = json.loads((data / "schema.json").read_text())
    acidity = schema["columns"][0]
    assert acidity["name"] == "fixed acidity" and acidity["input_name"] == "fixed_acidity"
    assert acidity["fill"] == acidity["mean"] and 7.5 < acidity["mean"] < 8.5
    assert schema["one_hot"] is True

    summary = train_summary(
        tmp_path / "model.py", data, run,
        "--workers", "2", "--ps", "1", "--epochs", "6", "--batch-size", "32",
        "--records-per-task", "64",
    )  # fmt: skip
    # Every evaluation saw finite inputs: an unfilled (NaN) value would poison the weights.
    assert all(np.isfinite(e["metrics"]["loss"]) for e in summary["evaluations"])
    assert summary["metrics"]["accuracy"] > 0.9

    result = evaluate(run, data, tmp_path / "metrics.json")
    assert result["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
    assert np.isfinite(result["loss"])

    # What training and evaluate read for an empty acidity: the mean, standardized to 0.
    import tensorflow as tf

    import elastic_step.model.serving  # noqa: F401 - registers the raw-input model's layer
    from elastic_step.data.feed import default_feed_for_model, records_dataset
    from elastic_step.data.schema import Schema
    from elastic_step.data.tfrecord import read_records

    # model.keras holds the raw-input model; its last layer is the trained model.
    model = tf.keras.models.load_model(run / "model.keras").layers[-1]
    loaded = Schema.load(str(data))
    records = [r for path, n in loaded.shard_paths(str(data), "validation")
               for r in read_records(path, 0, n)]  # fmt: skip
    missing = [
        "fixed acidity" not in tf.train.Example.FromString(r).features.feature for r in records
    ]
    assert 0 < sum(missing) < len(records)
    feed = default_feed_for_model(model)
    ((vector, labels),) = list(feed(records_dataset(records, len(records)), "evaluate", loaded))
    assert vector.shape == (len(records), WIDTH)
    assert np.all(vector.numpy()[missing, 0] == 0.0)
    assert np.all(np.isfinite(vector.numpy()))
    accuracy = np.mean(np.argmax(model(vector).numpy(), axis=1) == labels.numpy())
    assert accuracy == pytest.approx(result["metrics"]["accuracy"], abs=1e-6)
