"""Data sets the tests make from what packages ship (nothing is downloaded)."""

from __future__ import annotations

import csv
from pathlib import Path


def write_breast_cancer_csv(path: Path, label: str = "benign") -> None:
    """scikit-learn's breast cancer data, 569 records: 30 numeric columns, named as
    elastic_step/examples/breast_cancer.py expects, and the label (1 benign, 0 malignant)."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = [name.replace(" ", "_") for name in data.feature_names]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*names, label])
        for values, target in zip(data.data, data.target, strict=True):
            writer.writerow([*(f"{v:.6g}" for v in values), int(target)])
