"""What one kind of file system does for the storage layer (storage.py): the interface that
its local implementation (storage.py) and the object stores (object_storage.py) implement.

It is a module of its own so that object_storage.py depends on the interface, not on the
layer that chooses it: storage.py imports object_storage.py (lazily, by scheme), never the
other way round.
Tests: tests/unit/test_storage.py, tests/unit/test_object_storage.py.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import IO


class Storage(ABC):
    """One kind of file system. Paths given to it are full URIs or local paths."""

    @abstractmethod
    def open(self, path: str, mode: str = "rb") -> IO:
        """Opens a file; modes are those of :func:`open` (``rb``, ``wb``, ``r``, ``w``)."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file or directory exists at ``path``."""

    @abstractmethod
    def isdir(self, path: str) -> bool:
        """Whether ``path`` is a directory."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """Creates ``path`` and its parents; no error if it exists."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names (not paths) of the entries of directory ``path``, sorted."""

    @abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Moves ``src`` to ``dst``, replacing a file at ``dst``; atomic where the system allows."""

    @abstractmethod
    def remove(self, path: str) -> None:
        """Removes a file, or a directory with everything in it; no error if it is absent."""

    @abstractmethod
    def size(self, path: str) -> int:
        """Size of a file in bytes."""

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes of ``path`` from byte ``offset``, without reading the rest
        of the file; fewer only where the file ends."""

    @abstractmethod
    def write_atomic(self, path: str, data: bytes) -> None:
        """Replaces the file at ``path`` with ``data``: a reader sees the old content or the
        new, never a half-written file."""

    @abstractmethod
    def open_atomic(self, path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary file to write whose content replaces ``path`` (its directory made if
        need be) when the ``with`` block ends without an exception; after an exception
        ``path`` is left as it was. For writing more than fits in memory; see
        :meth:`write_atomic`."""

    @abstractmethod
    def publish_directory(self, tmp: str, path: str) -> None:
        """Puts the complete directory ``tmp`` in the place of ``path`` (replacing what is
        there) and removes ``tmp``; see :func:`atomic_directory`."""
