"""State stores: :func:`create_state_store` maps a store's name to its implementation."""

from __future__ import annotations

from collections.abc import Callable

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
from elastic_step.output_layout import OutputLayout

__all__ = [
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

_REGISTRY: dict[str, Callable[[str, StateStoreSettings], StateStore]] = {
    "file": lambda output_dir, settings: FileStateStore(
        OutputLayout(output_dir).state_dir, settings
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
