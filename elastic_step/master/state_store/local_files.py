"""Durable writes on a local file system: what the file store's lease, journal and snapshot share.

Every fsync goes through ``os.fsync`` (tests count them by wrapping it).
Tests: tests/unit/test_state_store.py.
"""

from __future__ import annotations

import contextlib
import os
import uuid

from elastic_step.data import storage
from elastic_step.master.state_store.api import StateStoreError

TMP_MARK = ".tmp-"


def local_dir(path: str) -> str:
    """The absolute local path of ``path``; a StateStoreError for a remote URI."""
    if not storage.is_local(path):
        raise StateStoreError(
            f"the file state store needs a local path, got {path} "
            "(it relies on flock, fsync and atomic rename)"
        )
    return storage.local_path(path)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: str) -> None:
    """Makes the directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replaces ``path`` with ``data`` durably: a reader, or a load after a crash, sees the old
    content or the new, never a mix. Temp file, fsync, rename, fsync of the directory."""
    tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def remove_temporaries(directory: str) -> None:
    """Removes what a crashed :func:`write_atomic` left behind."""
    for name in os.listdir(directory):
        if TMP_MARK in name:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
