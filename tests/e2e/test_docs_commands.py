"""The documentation's runnable commands, as a reader types them: every ```sh block of
docs/ that follows a ``<!-- runnable: ... -->`` line is run line by line, in a directory
holding what its commands name (``data.csv`` with a label column ``target``, ``model.py``,
``new.csv``), with ``elastic-step`` as installed; each command must exit 0."""

from __future__ import annotations

import csv
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from example_data import write_breast_cancer_csv

pytestmark = pytest.mark.e2e

DOCS = Path(__file__).resolve().parents[2] / "docs"
RUNNABLE = re.compile(r"<!-- runnable:[^>]*-->\n```sh\n(.*?)```", re.DOTALL)

#: A model for any numeric CSV with a class label: what a reader's model.py might be.
MODEL = """
import keras


def model(schema):
    names = [column.input_name for column in schema.columns]
    inputs = {name: keras.Input(shape=(), name=name) for name in names}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[n]) for n in names])
    x = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(schema.num_classes)(x))


loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = "adam"
metrics = ["accuracy"]
"""


def runnable_blocks() -> list[tuple[str, str]]:
    """(page, block) for each runnable block of the docs."""
    return [
        (str(page.relative_to(DOCS)), block)
        for page in sorted(DOCS.rglob("*.md"))
        for block in RUNNABLE.findall(page.read_text())
    ]


def test_the_docs_have_runnable_commands() -> None:
    assert [page for page, _ in runnable_blocks()] == ["getting-started.md"]


@pytest.fixture
def workdir(tmp_path) -> Path:
    """data.csv (scikit-learn's breast cancer, its label named "target"), new.csv (its first
    20 rows without the label) and model.py."""
    write_breast_cancer_csv(tmp_path / "data.csv", label="target")
    with open(tmp_path / "data.csv", newline="") as f:
        rows = list(csv.reader(f))[:21]
    with open(tmp_path / "new.csv", "w", newline="") as f:
        csv.writer(f).writerows(row[:-1] for row in rows)
    (tmp_path / "model.py").write_text(MODEL)
    return tmp_path


@pytest.mark.parametrize("page, block", runnable_blocks())
def test_a_runnable_block_runs_as_written(workdir, page, block) -> None:
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        argv = shlex.split(line)
        assert argv[0] == "elastic-step", line
        done = subprocess.run(
            [sys.executable, "-m", "elastic_step", *argv[1:]],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, f"{page}: {line}\n{done.stderr[-3000:]}"
    if page == "getting-started.md":  # what the page says the commands leave
        for path in ("run/model.keras", "metrics.json", "predictions/predictions.csv"):
            assert (workdir / path).exists(), path
        rows = (workdir / "predictions/predictions.csv").read_text().splitlines()
        assert len(rows) == 21  # a header and the 20 new rows
