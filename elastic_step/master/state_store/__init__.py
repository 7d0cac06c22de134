"""State stores: :func:`create_state_store` maps a store's name to its implementation."""

from __future__ import annotations

from collections.abc import Callable

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.master.state_store.api import StateStore, StateStoreError
from elastic_step.master.state_store.file_store import FileStateStore

__all__ = ["FileStateStore", "StateStore", "StateStoreError", "create_state_store"]

STATE_FILE = "master-state.json"

_REGISTRY: dict[str, Callable[[str], StateStore]] = {
    "file": lambda output_dir: FileStateStore(storage.join(output_dir, STATE_FILE)),
}


def create_state_store(name: str, output_dir: str) -> StateStore:
    """The store ``name`` for the job whose outputs go to ``output_dir``."""
    if name not in _REGISTRY:
        raise InputError(
            f"--state-store must be one of {', '.join(sorted(_REGISTRY))}, got '{name}'"
        )
    return _REGISTRY[name](output_dir)
