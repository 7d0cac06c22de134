"""A categorical column through an Embedding table split by row id over two PS shards."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from cli_runs import classifier_definition, evaluate, run_cli, train_summary, write_job_inputs

pytestmark = pytest.mark.e2e

CITIES = 20

MODEL = classifier_definition(
    f"""
def model():
    city = keras.Input(shape=(), name="city", dtype="int64")
    x = keras.Input(shape=(), name="x")
    # The default feed gives vocabulary ids 0..{CITIES - 1}, and {CITIES} for an unseen city.
    embedded = keras.layers.Embedding({CITIES + 1}, 4)(city)
    hidden = keras.layers.Concatenate()([embedded, keras.layers.Reshape((1,))(x)])
    return keras.Model({{"city": city, "x": x}}, keras.layers.Dense(2)(hidden))
""",
    optimizer="keras.optimizers.Adam(0.05)",
    accuracy=True,
)


def test_embedding_rows_live_on_the_shard_of_their_id(tmp_path):
    rng = np.random.default_rng(0)
    rows = ["city,x,label"]
    for i in range(1200):
        city = i % CITIES
        # The label is a property of the city: only its embedding can tell.
        rows.append(f"c{city},{rng.normal():.4f},{int(city % 3 == 0)}")
    csv, data, run = write_job_inputs(tmp_path, "cities.csv", rows, MODEL)

    prep = run_cli("preprocess", "--input", str(csv), "--label", "label",
                   "--output", str(data))  # fmt: skip
    assert prep.returncode == 0, prep.stderr
    schema = json.loads((data / "schema.json").read_text())
    assert [c["kind"] for c in schema["columns"]] == ["categorical", "numeric"]

    summary = train_summary(
        tmp_path / "model.py", data, run,
        "--ps", "2", "--workers", "2", "--epochs", "3", "--batch-size", "32",
        "--records-per-task", "128", "--checkpoint-steps", "20", "--evaluation-steps", "5",
    )  # fmt: skip
    assert summary["metrics"]["accuracy"] > 0.95
    # Evaluations every 5 model versions (a version is a push: a window of local steps, here
    # a whole task), besides one at the end of each epoch.
    triggers = [e["trigger"] for e in summary["evaluations"]]
    assert triggers.count("epoch-end") == 3 and "steps" in triggers
    assert summary["evaluations"][-1]["trigger"] == "epoch-end"

    # Each shard holds the table rows whose id is its index modulo 2, nothing else.
    for shard, expected_rows in ((0, 11), (1, 10)):
        directory = run / "checkpoints" / f"ps-{shard}-of-2"
        newest = sorted(directory.glob("version-*.npz"))[-1]
        with np.load(io.BytesIO(newest.read_bytes())) as saved:
            tables = {k: saved[k] for k in saved.files if k.startswith("table/")}
        assert [t.shape for t in tables.values()] == [(expected_rows, 4)]

    result = evaluate(run, data, tmp_path / "metrics.json")
    assert result["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
