"""Checkpoints of one PS shard: ``version-V.npz`` files in the shard's directory (see
:meth:`elastic_step.output_layout.OutputLayout.checkpoint_dir`).
Tests: tests/unit/test_ps.py."""

from __future__ import annotations

import io
import logging
import zipfile

import numpy as np

from elastic_step.data import storage

log = logging.getLogger(__name__)


def _versions(directory: str) -> list[int]:
    if not storage.exists(directory):
        return []
    names = storage.listdir(directory)
    return sorted(
        int(n[len("version-") : -len(".npz")])
        for n in names
        if n.startswith("version-") and n.endswith(".npz")
    )


def _path(directory: str, version: int) -> str:
    return storage.join(directory, f"version-{version:012d}.npz")


def save(directory: str, version: int, arrays: dict[str, np.ndarray], keep: int) -> str:
    """Writes a checkpoint atomically, then removes all but the newest ``keep``."""
    storage.makedirs(directory)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path = _path(directory, version)
    storage.write_bytes_atomic(path, buffer.getvalue())
    for old in _versions(directory)[:-keep]:
        storage.remove(_path(directory, old))
    return path


def load_latest(directory: str) -> tuple[int, dict[str, np.ndarray]] | None:
    """The newest readable checkpoint's version and arrays, or None when there is none."""
    for version in reversed(_versions(directory)):
        path = _path(directory, version)
        try:
            with np.load(io.BytesIO(storage.read_bytes(path))) as data:
                return version, {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # truncated, corrupt
            log.warning("skipping unreadable checkpoint %s: %s", path, e)
    return None
