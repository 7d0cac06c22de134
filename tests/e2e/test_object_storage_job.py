"""A whole job on S3: preprocess, train (1 worker, 1 PS) and evaluate with every input and
output an s3:// URI, against a real S3-compatible server that checks credentials. Only the
master's state and the instances' logs stay on local disk (--state-dir)."""

from __future__ import annotations

import json

import pytest

from elastic_step.cli import main
from elastic_step.data import storage
from elastic_step.demo import write_digits_csv
from elastic_step.examples import path_of

pytestmark = pytest.mark.e2e


def test_preprocess_train_evaluate_on_s3(s3_env, tmp_path):
    bucket = s3_env.new_bucket()
    root = f"s3://{bucket}"
    write_digits_csv(str(tmp_path / "digits.csv"))
    storage.write_bytes_atomic(f"{root}/digits.csv", (tmp_path / "digits.csv").read_bytes())

    assert main(["preprocess", "--input", f"{root}/digits.csv", "--label", "digit",
                 "--output", f"{root}/data", "--shards", "2"]) == 0  # fmt: skip
    data_keys = s3_env.keys(bucket, "data/")
    assert "data/schema.json" in data_keys
    assert len([k for k in data_keys if k.startswith("data/train/")]) == 4  # 2 shards, 2 indexes

    state_dir = tmp_path / "state"
    train = [
        "train", "--model-def", path_of("digits"), "--data", f"{root}/data",
        "--output", f"{root}/run", "--state-dir", str(state_dir), "--epochs", "2",
        "--workers", "1", "--ps", "1", "--batch-size", "32", "--records-per-task", "256",
        "--checkpoint-steps", "2", "--seed", "3",  # 12 versions (pushes): 6 checkpoints
    ]  # fmt: skip
    assert main(train) == 0

    summary = json.loads(storage.read_text(f"{root}/run/summary.json"))
    assert summary["phase"] == "succeeded"
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2]
    for epoch in summary["epochs"]:
        assert epoch["records_trained"] == epoch["records_expected"] == 1438
    status = json.loads(storage.read_text(f"{root}/run/status.json"))
    assert status["phase"] == "succeeded"

    run_keys = s3_env.keys(bucket, "run/")
    for key in ("run/model.keras", "run/saved_model/saved_model.pb", "run/model_def.py"):
        assert key in run_keys
    # The PS wrote its checkpoints to the store, keeping the newest 3 (--keep-checkpoints).
    checkpoints = [k for k in run_keys if k.startswith("run/checkpoints/ps-0-of-1/")]
    assert len(checkpoints) == 3 and all(k.endswith(".npz") for k in checkpoints)
    # What must be local stayed local; nothing half-written is left in the bucket.
    assert not [k for k in run_keys if k.startswith(("run/master-state", "run/backend"))]
    assert not [k for k in s3_env.keys(bucket) if ".tmp-" in k or ".old-" in k]
    assert (state_dir / "master-state").is_dir()
    worker_log = (state_dir / "backend" / "logs" / "worker-0.log").read_text()
    # The model definition, read from the bucket, is converted like a local one.
    assert "AutoGraph could not transform" not in worker_log

    # A retried step finds the finished job through the same --state-dir and does nothing.
    assert main(train) == 0
    assert json.loads(storage.read_text(f"{root}/run/summary.json")) == summary

    metrics_output = f"{root}/eval/metrics.json"
    assert main(["evaluate", "--model", f"{root}/run", "--data", f"{root}/data",
                 "--metrics-output", metrics_output]) == 0  # fmt: skip
    metrics = json.loads(storage.read_text(metrics_output))
    assert metrics["records"] == 1797 - 1438
    # The model in the bucket is the one the master evaluated last.
    assert metrics["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
