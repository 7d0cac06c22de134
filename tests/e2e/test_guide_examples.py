"""The model definition guide's examples, as a reader copies them: every ```python block of
docs/guides/model-definition.md that defines ``model()`` is trained by the real command on
scikit-learn's wine data, whose column ``od280/od315_of_diluted_wines`` needs another input
name, with a categorical column added; the saved model then takes the CSV's raw values."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from conftest import TrainRun

from elastic_step.cli import main

pytestmark = pytest.mark.e2e

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "model-definition.md"


def model_definitions() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)
    return [b for b in blocks if re.search(r"^def model\(", b, flags=re.MULTILINE)]


def test_the_guide_has_model_definitions_to_run() -> None:
    assert model_definitions(), f"no ```python block with def model() in {GUIDE}"


@pytest.fixture(scope="module")
def wine_data(tmp_path_factory) -> Path:
    from sklearn.datasets import load_wine

    root = tmp_path_factory.mktemp("wine")
    wine = load_wine()
    assert "od280/od315_of_diluted_wines" in wine.feature_names  # not a valid input name
    with open(root / "wine.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*wine.feature_names, "cellar", "cultivar"])
        for i, (row, label) in enumerate(zip(wine.data, wine.target, strict=True)):
            writer.writerow([*row.tolist(), ["north", "south", "east"][i % 3], int(label)])
    argv = ["preprocess", "--input", str(root / "wine.csv"), "--label", "cultivar"]
    assert main([*argv, "--output", str(root / "data")]) == 0
    return root / "data"


@pytest.mark.parametrize("index", range(len(model_definitions())))
def test_a_guides_model_definition_trains_on_renamed_and_categorical_columns(
    tmp_path, wine_data, index
) -> None:
    source = model_definitions()[index]
    model_def = tmp_path / "model_def.py"
    model_def.write_text(source)
    copy = tmp_path / "summary-output.json"
    run = TrainRun(
        wine_data,
        tmp_path / "run",
        *("--epochs", "2", "--summary-output", str(copy)),
        model_def=str(model_def),
    )
    try:
        assert run.start().wait() == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    summary = run.summary()
    assert summary["phase"] == "succeeded" and summary["job_name"].startswith("es-")
    assert json.loads(copy.read_text()) == summary  # what a pipeline step outputs
    assert all(e["records_trained"] == e["records_expected"] for e in summary["epochs"])
    # No feed() of its own: the saved model takes the CSV's raw values, by input name.
    assert "has a feed() of its own" not in run.log()
    import keras
    import numpy as np
    import tensorflow as tf

    import elastic_step.model.serving  # noqa: F401 - registers the preprocessing layer

    model = keras.models.load_model(run.output / "model.keras")
    names = {i.name for i in model.inputs}
    assert "cellar" in names and "od280/od315_of_diluted_wines" not in names, names
    row = {name: tf.constant([1.0]) for name in names}
    row["cellar"] = tf.constant(["west"])  # a value the vocabulary has not seen
    assert np.asarray(model.predict(row, verbose=0)).shape == (1, 10)
