"""A state store in one JSON file, replaced atomically (write a temporary file, then rename)."""

from __future__ import annotations

import json

from elastic_step.data import storage
from elastic_step.master.state_store.api import StateStore, StateStoreError

FORMAT_VERSION = 1


class FileStateStore(StateStore):
    def __init__(self, path: str) -> None:
        self._path = path

    def load(self) -> dict | None:
        if not storage.exists(self._path):
            return None
        try:
            document = json.loads(storage.read_text(self._path))
        except (OSError, ValueError) as e:
            raise StateStoreError(f"cannot read master state {self._path}: {e}") from e
        if not isinstance(document, dict) or not isinstance(document.get("state"), dict):
            raise StateStoreError(f"master state {self._path} is not a saved state")
        if document.get("format") != FORMAT_VERSION:
            raise StateStoreError(
                f"master state {self._path} has format {document.get('format')!r}, "
                f"this version reads format {FORMAT_VERSION}"
            )
        return document["state"]

    def save(self, state: dict) -> None:
        document = {"format": FORMAT_VERSION, "state": state}
        try:
            storage.write_text_atomic(self._path, json.dumps(document, separators=(",", ":")))
        except OSError as e:
            raise StateStoreError(f"cannot save master state {self._path}: {e}") from e

    def describe(self) -> str:
        return self._path
