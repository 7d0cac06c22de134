"""Checkpoints of one PS shard: ``version-V-tT.npz`` files in the shard's directory (see
:meth:`elastic_step.output_layout.OutputLayout.checkpoint_dir`), V the model version and T
the fencing token of the master whose job wrote it.

The newest checkpoint is the one of the newest master, then of the highest version: a PS
of a master that was replaced, still running, cannot win over the current master's with a
higher version of a model that went its own way. A file that cannot be a checkpoint
(``version-latest.npz``) or cannot be read is set aside (``set-aside/`` beside it) with one
line, never deleted, and never read again.

A checkpoint is streamed both ways: written array by array into the file (an object is
uploaded in parts), and read array by array from it, so neither holds a second copy of the
shard's tables in memory as a whole file would.
Tests: tests/unit/test_ps.py.
"""

from __future__ import annotations

import logging
import re
import zipfile
from dataclasses import dataclass
from typing import IO

import numpy as np

from elastic_step.data import storage

log = logging.getLogger(__name__)

_NAME = re.compile(r"version-(\d+)(?:-t(\d+))?\.npz")


@dataclass(frozen=True, order=True)
class _Checkpoint:
    token: int
    version: int
    name: str


def _checkpoints(directory: str) -> list[_Checkpoint]:
    """The directory's checkpoints, oldest first; a file named like one that is not is set
    aside. Files being written (``.tmp-``) are left alone."""
    if not storage.exists(directory):
        return []
    found = []
    for name in storage.listdir(directory):
        if not name.startswith("version-") or ".tmp-" in name:
            continue
        match = _NAME.fullmatch(name)
        if match is None:
            storage.set_aside(
                storage.join(directory, name),
                "not a checkpoint's name (version-<model version>-t<token>.npz)",
            )
            continue
        found.append(_Checkpoint(int(match[2] or 0), int(match[1]), name))
    return sorted(found)


def _path(directory: str, version: int, token: int) -> str:
    return storage.join(directory, f"version-{version:012d}-t{token}.npz")


def save(directory: str, version: int, arrays: dict[str, np.ndarray], keep: int, token: int) -> str:
    """Writes a checkpoint atomically, streamed, then removes all but the newest ``keep``."""
    storage.makedirs(directory)
    path = _path(directory, version, token)
    with storage.open_atomic(path) as f:
        np.savez(f, **arrays)
    for old in _checkpoints(directory)[:-keep]:
        storage.remove(storage.join(directory, old.name))
    return path


def load_latest(directory: str) -> tuple[int, dict[str, np.ndarray]] | None:
    """The newest readable checkpoint's version and arrays, or None when there is none.
    One that does not parse (truncated, corrupt) is set aside, and the next newest is tried;
    an error reading the file is raised."""
    for checkpoint in reversed(_checkpoints(directory)):
        path = storage.join(directory, checkpoint.name)
        try:
            with storage.open_file(path, "rb") as raw, np.load(_Reading(raw)) as data:
                return checkpoint.version, {k: data[k] for k in data.files}
        except _ReadError as e:  # an error reading is not the file's fault
            raise e.__cause__ from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            storage.set_aside(path, f"not a readable checkpoint ({type(e).__name__}: {e})")
    return None


class _ReadError(Exception):
    """The storage failed to read: raised from the storage's error (its ``__cause__``)."""


class _Reading:
    """A file being read, its storage's errors told apart from what np.load makes of the
    bytes (which, for a damaged file, can be an OSError too)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        try:
            return self._raw.read(size)
        except OSError as e:
            raise _ReadError() from e

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self._raw.seek(offset, whence)
        except OSError as e:
            raise _ReadError() from e

    def tell(self) -> int:
        return self._raw.tell()

    def seekable(self) -> bool:
        return True
