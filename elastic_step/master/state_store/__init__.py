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


def _kubernetes_store(
    output_dir: str, settings: StateStoreSettings, job_name: str | None, namespace: str | None
) -> StateStore:
    if not job_name:
        raise InputError("the kubernetes state store needs the job's name (job_name)")
    # Imported here: the kubernetes client is needed only by this store.
    from elastic_step.master.state_store.kubernetes_store import KubernetesStateStore

    return KubernetesStateStore(job_name, namespace, settings)


#: Each maker takes the output directory, the settings, the job's name and its namespace;
#: a store uses what it needs.
_REGISTRY: dict[str, Callable[[str, StateStoreSettings, str | None, str | None], StateStore]] = {
    "file": lambda output_dir, settings, job_name, namespace: FileStateStore(
        OutputLayout(output_dir).state_dir, settings
    ),
    "kubernetes": _kubernetes_store,
}


def state_store_names() -> list[str]:
    return sorted(_REGISTRY)


def create_state_store(
    name: str,
    output_dir: str,
    settings: StateStoreSettings | None = None,
    *,
    job_name: str | None = None,
    namespace: str | None = None,
) -> StateStore:
    """The store ``name`` for the job whose outputs go to ``output_dir``.

    ``kubernetes`` keeps the state in ConfigMaps and a Lease named after ``job_name`` (needed)
    in ``namespace`` (default: the pod's own namespace, else the kubeconfig context's), with
    the pod's ServiceAccount or else the kubeconfig; see kubernetes_store.py. ``file`` ignores
    both.
    """
    if name not in _REGISTRY:
        raise InputError(
            f"--state-store must be one of {', '.join(state_store_names())}, got '{name}'"
        )
    return _REGISTRY[name](output_dir, settings or StateStoreSettings(), job_name, namespace)
