"""State stores: :func:`create_state_store` maps a store's name to its implementation."""

from __future__ import annotations

from collections.abc import Callable

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.master.state_store.api import (
    SavedState,
    StateStore,
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
    StateStoreSettings,
)
from elastic_step.master.state_store.file_store import FileStateStore

__all__ = [
    "LEGACY_STATE_FILE",
    "STATE_DIR",
    "FileStateStore",
    "SavedState",
    "StateStore",
    "StateStoreError",
    "StateStoreFencedError",
    "StateStoreLockedError",
    "StateStoreSettings",
    "create_state_store",
    "state_store_names",
]

#: Where the file store keeps the state, under the job's output directory.
STATE_DIR = "master-state"
#: The single-file state (format 1) of earlier versions, which this package no longer reads.
LEGACY_STATE_FILE = "master-state.json"

_REGISTRY: dict[str, Callable[[str, StateStoreSettings], StateStore]] = {
    "file": lambda output_dir, settings: FileStateStore(
        storage.join(output_dir, STATE_DIR), settings
    ),
}


def state_store_names() -> list[str]:
    return sorted(_REGISTRY)


def create_state_store(
    name: str, output_dir: str, settings: StateStoreSettings | None = None
) -> StateStore:
    """The store ``name`` for the job whose outputs go to ``output_dir``."""
    if name not in _REGISTRY:
        raise InputError(
            f"--state-store must be one of {', '.join(state_store_names())}, got '{name}'"
        )
    return _REGISTRY[name](output_dir, settings or StateStoreSettings())
