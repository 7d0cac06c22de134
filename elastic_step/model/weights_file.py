"""A model's weights in one file: ``np.savez`` of ``model.get_weights()``, in order (the
definition builds the same variables in every process). ``--keep-best`` keeps each better
round's model this way; the worker that saves the job's model reads the kept one.
Tests: tests/e2e/test_watching.py (test_keep_best_exports_the_best_rounds_model)."""

from __future__ import annotations

import io

import numpy as np

from elastic_step.data import storage


def write_weights(path: str, weights: list[np.ndarray]) -> None:
    """Writes ``weights`` to ``path`` (a path or URI) by an atomic rename."""
    buffer = io.BytesIO()
    np.savez(buffer, *weights)
    storage.makedirs(storage.parent(path))
    storage.write_bytes_atomic(path, buffer.getvalue())


def read_weights(path: str) -> list[np.ndarray]:
    """The weights :func:`write_weights` wrote to ``path``, in order."""
    with np.load(io.BytesIO(storage.read_bytes(path))) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]
