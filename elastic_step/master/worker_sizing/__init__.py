"""Sizing policies: how many workers a job wants. See :mod:`.api`.

May import: no other room.
"""

from __future__ import annotations

from collections.abc import Callable

from elastic_step.master.worker_sizing.all_running import GrowWhileAllRun
from elastic_step.master.worker_sizing.api import (
    SizingAction,
    SizingDecision,
    SizingError,
    SizingSettings,
    SizingView,
    WorkerSizing,
)
from elastic_step.master.worker_sizing.throughput import ThroughputSizing

_REGISTRY: dict[str, Callable[[SizingSettings], WorkerSizing]] = {
    GrowWhileAllRun.name: GrowWhileAllRun,
    ThroughputSizing.name: ThroughputSizing,
}


def sizing_names() -> list[str]:
    return sorted(_REGISTRY)


def create_worker_sizing(name: str, settings: SizingSettings) -> WorkerSizing:
    if name not in _REGISTRY:
        raise SizingError(f"no worker sizing policy {name!r}; choose one of {sizing_names()}")
    return _REGISTRY[name](settings)


__all__ = [
    "SizingAction",
    "SizingDecision",
    "SizingError",
    "SizingSettings",
    "SizingView",
    "WorkerSizing",
    "create_worker_sizing",
    "sizing_names",
]
