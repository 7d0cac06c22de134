"""``elastic-step demo``: preprocess, elastic training and evaluation on scikit-learn's digits.

The data ships inside scikit-learn; nothing is downloaded.
Tests: write_digits_csv makes the digits of tests/e2e/conftest.py; run_demo has none.
"""

from __future__ import annotations

import csv
import json
import logging
import os

from elastic_step.data import storage
from elastic_step.examples import path_of
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step")


def write_digits_csv(path: str) -> int:
    """Writes the 1797 8x8 digits as CSV: pixel_0 … pixel_63, digit. Returns the row count."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"pixel_{i}" for i in range(64)] + ["digit"])
        for pixels, label in zip(digits.data, digits.target, strict=True):
            writer.writerow([int(p) for p in pixels] + [int(label)])
    return len(digits.target)


def run_demo(workdir: str, epochs: int = 8) -> int:
    from elastic_step.data.preprocess import preprocess
    from elastic_step.evaluate import evaluate
    from elastic_step.master.config import TrainConfig
    from elastic_step.training import train

    os.makedirs(workdir, exist_ok=True)
    csv_path = os.path.join(workdir, "digits.csv")
    data_dir = os.path.join(workdir, "data")
    output = os.path.join(workdir, "run")
    metrics_path = os.path.join(workdir, "metrics.json")

    log.info("step 1/3: writing scikit-learn's digits to %s", csv_path)
    rows = write_digits_csv(csv_path)
    log.info("step 1/3: preprocessing %d rows into %s", rows, data_dir)
    preprocess(input_path=csv_path, label="digit", output=data_dir, progress=log.info)

    log.info("step 2/3: elastic training, 2 workers and 1 PS, %d epochs, into %s", epochs, output)
    if os.path.exists(output):
        import shutil

        shutil.rmtree(output)
    config = TrainConfig(
        model_def=path_of("digits"),
        data=data_dir,
        output=output,
        epochs=epochs,
        batch_size=32,
        workers=2,
        ps=1,
        records_per_task=128,
    )
    status = train(config)
    if status != 0:
        return status

    log.info("step 3/3: evaluating on the validation split")
    result = evaluate(
        model_dir=output, data_dir=data_dir, split="validation", metrics_output=metrics_path
    )
    summary = json.loads(storage.read_text(OutputLayout(output).summary))
    print()
    print(f"validation accuracy: {result['metrics']['accuracy']:.3f}   loss: {result['loss']:.3f}")
    print(
        f"throughput: {summary['examples_per_second']} examples/s; restarts: {summary['restarts']}"
    )
    for epoch in summary["epochs"]:
        trained, expected = epoch["records_trained"], epoch["records_expected"]
        print(f"epoch {epoch['epoch']}: {trained}/{expected} records")
    print(f"outputs: {output}/ (model.keras, saved_model/, summary.json, report.html)")
    print(f"metrics: {metrics_path}")
    return 0
