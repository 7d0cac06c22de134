"""Where the master keeps the state it needs to resume a job after a restart.

The state is one JSON-ready dict: the task queues, epoch, model version, worker registry and
metrics so far. A store saves it whole and atomically: a load after a crash returns the last
complete save, never a mix of two.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class StateStoreError(Exception):
    """The state could not be saved or read back (the message names where and why)."""


class StateStore(ABC):
    @abstractmethod
    def load(self) -> dict | None:
        """The last saved state, or None when nothing was ever saved."""

    @abstractmethod
    def save(self, state: dict) -> None:
        """Replaces the saved state atomically."""

    @abstractmethod
    def describe(self) -> str:
        """Where the state lives, for logs and messages."""
