"""bench/quality.py, small: wine with two workers, and diabetes with one, one seed each. The
bench is not a test (nothing fails on a missed target); this keeps it from rotting, and checks
that the elastic job with its default flags lands where ``model.fit`` does: near it with two
workers, on it with one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    """A bench script run as a user runs it, which must succeed."""
    result = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result


def test_the_quality_bench_compares_fit_and_elastic(tmp_path: Path) -> None:
    result = run_bench("bench/quality.py", "--data-sets", "wine", "--seeds", "1",
                       "--workers", "2", "--workdir", str(tmp_path))  # fmt: skip
    report = json.loads((tmp_path / "quality.json").read_text())
    wine = report["data_sets"]["wine"]
    assert wine["metric"] == "accuracy"
    assert [r["seed"] for r in wine["fit"]] == [0]
    assert [(r["workers"], r["seed"]) for r in wine["elastic"]] == [(2, 0)]
    fit = wine["fit"][0]["value"]
    assert fit > 0.85, wine  # a model that learned: the bench compares something
    row = wine["by_workers"]["2"]
    # 36 validation records: one record is 2.8 points; the default flags keep fit's model.
    assert row["elastic_mean"] >= fit - 2 / 36, row
    assert row["fit_mean"] == fit
    assert row["paired_gap"] == row["elastic_mean"] - fit
    # One line per data set and worker count, and who won.
    lines = result.stdout.splitlines()
    assert any(line.startswith("wine") and line.split()[1] == "2" for line in lines)
    assert any(line.startswith("wine: better by mean") for line in lines)


def test_one_worker_with_the_defaults_trains_fits_very_model(tmp_path: Path) -> None:
    # Same seed, same initial values and, on a split with permuted tasks, the same batches in
    # the same order (bench/quality.py's fit_batches): with one worker, nothing asynchronous
    # is left, and the master's local steps change where the updates are added, not what
    # they are. Diabetes' MSE tells one model from another where an accuracy would not.
    run_bench("bench/quality.py", "--data-sets", "diabetes", "--seeds", "1", "--workers", "1",
              "--workdir", str(tmp_path))  # fmt: skip
    diabetes = json.loads((tmp_path / "quality.json").read_text())["data_sets"]["diabetes"]
    assert diabetes["metric"] == "loss"
    fit, elastic = diabetes["fit"][0]["value"], diabetes["elastic"][0]["value"]
    assert fit < 0.7, diabetes  # a model that learned (the label is standardized: 1 is none)
    assert elastic == pytest.approx(fit, rel=1e-5), diabetes


def test_the_data_order_study_trains_each_order_over_seeds(tmp_path: Path) -> None:
    result = run_bench("bench/data_order.py", "--data-set", "wine", "--seeds", "2",
                       "--orders", "fit,split", "--workdir", str(tmp_path))  # fmt: skip
    report = json.loads((tmp_path / "data_order.json").read_text())
    assert report["metric"] == "accuracy" and set(report["orders"]) == {"fit", "split"}
    for order, row in report["orders"].items():
        assert len(row["values"]) == 2, row
        assert min(row["values"]) > 0.85, (order, row)  # both orders learn wine
    rows = [line.split()[0] for line in result.stdout.splitlines() if not line.startswith("[")]
    assert rows == ["fit", "split"], result.stdout  # one line per order, the logs aside
