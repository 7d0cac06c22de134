"""A job trains on what `preprocess --runner beam` wrote: numeric columns with empty cells,
a categorical one, and a text label, on Beam's local runner; then evaluate reads it too."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runs import evaluate, mlp_classifier, run_cli, train_summary, write_job_inputs

pytest.importorskip("apache_beam")

pytestmark = pytest.mark.e2e

# 2 numeric columns, and a categorical one as one-hot over 2 regions, "" and the unseen id.
WIDTH = 2 + 4

MODEL = mlp_classifier(WIDTH, 8, 2, optimizer="keras.optimizers.Adam(0.05)", accuracy=True)


def test_a_job_trains_on_the_beam_output(tmp_path):
    rng = np.random.default_rng(3)
    rows = ["size,weight,region,kind"]
    for i in range(200):
        kind = i % 2
        size = "" if i % 9 == 0 else f"{rng.normal(2 + 3 * kind, 0.5):.3f}"
        region = "" if i % 7 == 0 else ["north", "south"][rng.integers(2)]
        rows.append(f"{size},{rng.normal(5, 1):.3f},{region},{'ab'[kind]}")
    csv, data, run = write_job_inputs(tmp_path, "items.csv", rows, MODEL)

    prep = run_cli("preprocess", "--input", str(csv), "--label", "kind",
                   "--output", str(data), "--fill-missing", "mean", "--one-hot",
                   "--runner", "beam")  # fmt: skip
    assert prep.returncode == 0, prep.stderr
    assert "with Apache Beam on FnApiRunner" in prep.stderr
    schema = json.loads((data / "schema.json").read_text())
    assert schema["records"] == {"train": 160, "validation": 40}

    summary = train_summary(
        tmp_path / "model.py", data, run,
        "--workers", "2", "--ps", "1", "--epochs", "2", "--batch-size", "16",
        "--records-per-task", "40",
    )  # fmt: skip
    assert len(summary["epochs"]) == 2
    assert all(np.isfinite(e["metrics"]["loss"]) for e in summary["evaluations"])
    assert summary["metrics"]["accuracy"] > 0.8

    result = evaluate(run, data, tmp_path / "metrics.json")
    assert result["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
