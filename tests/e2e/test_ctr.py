"""A click-through job at test size, end to end: 20,000 Criteo-shaped rows
(bench/criteo_data.py) in Parquet, preprocessed with capped vocabularies, out-of-vocabulary
buckets and two hashed id columns; the CTR example (examples/ctr.py, an embedding per column)
trained by 2 workers and 2 PS while a PS and a worker are SIGKILLed mid-epoch; then the
served model on raw values, unseen ids included, against the feed's own encoding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TrainRun, mid_epoch, records_exact

import elastic_step.model.serving  # noqa: F401 - registers the raw-input layer for load_model
from elastic_step.data.feed import DefaultFeed, records_dataset
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.examples import path_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from criteo_data import generate

ROWS = 20_000
PREPROCESS = [
    "--fill-missing", "zero", "--max-vocabulary", "2000", "--oov-buckets", "64",
    "--hash-buckets", "c25=20000,c26=20000",
]  # fmt: skip


@pytest.fixture(scope="module")
def criteo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rows in two Parquet files, and what preprocess made of them (``data``)."""
    root = tmp_path_factory.mktemp("criteo")
    generate(str(root / "raw"), rows=ROWS, shards=2, seed=3, formats=("parquet",),
             log=lambda _: None)  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(root / "raw"),
         "--label", "label", "--output", str(root / "data"), *PREPROCESS],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def trained(criteo: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainRun:
    """The job, a PS and a worker killed once the PS have written checkpoints."""
    output = tmp_path_factory.mktemp("ctr") / "run"
    run = TrainRun(
        criteo / "data", output,
        "--workers", "2", "--ps", "2", "--epochs", "2", "--batch-size", "128",
        "--records-per-task", "1024", "--checkpoint-steps", "10",
        model_def=path_of("ctr"),
    ).start()  # fmt: skip
    try:
        with run.held(lambda s: mid_epoch(s) and s["model_version"] >= 12) as status:
            ps = status["ps"][1]
            worker = next(w for w in status["workers"] if w["state"] == "running")
            os.kill(ps["pid"], signal.SIGKILL)
            os.kill(worker["pid"], signal.SIGKILL)
        assert run.wait(timeout=400) == 0, run.log()[-3000:]
    finally:
        run.kill_all()
    return run


def test_the_schema_has_capped_and_hashed_id_columns(criteo: Path) -> None:
    schema = Schema.load(str(criteo / "data"))
    assert sum(schema.records.values()) == ROWS
    kinds = [c.kind for c in schema.columns]
    assert kinds == ["numeric"] * 13 + ["categorical"] * 26
    small, capped, hashed = schema.feature("c1"), schema.feature("c20"), schema.feature("c26")
    assert small.vocabulary_size == 11 and small.num_ids == 11 + 64  # 10 ids and the empty
    assert capped.vocabulary_size == 2000 and capped.num_ids == 2064
    assert hashed.hashed and hashed.num_ids == 20_000


def test_the_job_rides_out_a_ps_and_a_worker_kill(trained: TrainRun) -> None:
    summary = trained.summary()
    assert records_exact(summary), summary["epochs"]
    assert summary["restarts"]["ps"] == 1 and summary["restarts"]["worker"] >= 1
    [restore] = summary["ps_restores"]
    assert restore["restored_version"] > 0, restore
    relaunched = (trained.output / "backend" / "logs" / "ps-1-1.log").read_text()
    assert "restored shard 1 from checkpoint version" in relaunched
    # It learned: the best AUC on this data is about 0.83, fit's after 2 epochs about 0.7.
    assert summary["metrics"]["auc"] > 0.62, summary["metrics"]


def test_the_served_model_encodes_raw_values_unseen_ids_included_as_the_feed_does(
    criteo: Path, trained: TrainRun
) -> None:
    schema = Schema.load(str(trained.output))  # the run's copy, with its vocabularies
    records = [
        r for path, n in schema.shard_paths(str(criteo / "data"), "validation")
        for r in read_records(path, 0, n)
    ][:200]  # fmt: skip
    # Unseen ids: one in a column with a vocabulary, one in a hashed column.
    changed = []
    for record in records[:20]:
        example = tf.train.Example.FromString(record)
        example.features.feature["c20"].bytes_list.value[:] = [b"never-seen-20"]
        example.features.feature["c26"].bytes_list.value[:] = [b"never-seen-26"]
        changed.append(example.SerializeToString())
    records = changed + records[20:]

    served = tf.saved_model.load(str(trained.output / "saved_model"))
    probabilities = served.signatures["serving_default"](examples=tf.constant(records))
    got = probabilities["probabilities"].numpy()[:, 1]

    trained_model = keras.models.load_model(trained.output / "model.keras").layers[-1]
    ((features, _),) = list(DefaultFeed(schema)(records_dataset(records, len(records)), "predict"))
    want = tf.sigmoid(trained_model(features, training=False)).numpy()[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The unseen ids took out-of-vocabulary ids (after the 2,000 entries) and hash buckets.
    c20 = features["c20"].numpy()
    assert ((c20[:20] >= 2000) & (c20[:20] < 2064)).all() and (c20[20:] < 2064).all()
    assert ((features["c26"].numpy() >= 0) & (features["c26"].numpy() < 20_000)).all()
