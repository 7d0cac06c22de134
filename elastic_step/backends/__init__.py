"""Backends run the job's workers and parameter servers: ``local`` processes or Kubernetes pods.

:func:`create_backend` maps a backend's name to its implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_step.backends.api import (
    Backend,
    BackendError,
    EventKind,
    ExitReason,
    InstanceEvent,
    InstanceInfo,
    LaunchRejectedError,
    LaunchSpec,
    Resources,
    Role,
)
from elastic_step.errors import InputError

__all__ = [
    "Backend",
    "BackendError",
    "BackendParams",
    "EventKind",
    "ExitReason",
    "InstanceEvent",
    "InstanceInfo",
    "LaunchRejectedError",
    "LaunchSpec",
    "Resources",
    "Role",
    "backend_names",
    "create_backend",
]


@dataclass(frozen=True)
class BackendParams:
    """What every backend is built from."""

    #: The job's name (a DNS-1123 label): it names and labels the job's instances.
    job_name: str
    #: A local directory where the backend may keep its own records and the instances' logs.
    work_dir: str
    #: The backend's own typed options (``LocalOptions``, ``KubernetesOptions``); None for
    #: defaults.
    options: Any = None


def _local(params: BackendParams) -> Backend:
    from elastic_step.backends.local import LocalBackend, LocalOptions

    options = params.options
    if options is not None and not isinstance(options, LocalOptions):
        raise TypeError(f"the local backend takes LocalOptions, not {type(options)}")
    return LocalBackend(params.job_name, params.work_dir, options)


def _kubernetes(params: BackendParams) -> Backend:
    from elastic_step.backends.kubernetes import KubernetesBackend
    from elastic_step.backends.kubernetes_options import KubernetesOptions

    options = params.options
    if options is not None and not isinstance(options, KubernetesOptions):
        raise TypeError(f"the kubernetes backend takes KubernetesOptions, not {type(options)}")
    return KubernetesBackend(params.job_name, options)


_REGISTRY: dict[str, Callable[[BackendParams], Backend]] = {
    "local": _local,
    "kubernetes": _kubernetes,
}


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def create_backend(name: str, params: BackendParams) -> Backend:
    if name not in _REGISTRY:
        raise InputError(f"--backend must be one of {', '.join(backend_names())}, got '{name}'")
    return _REGISTRY[name](params)
