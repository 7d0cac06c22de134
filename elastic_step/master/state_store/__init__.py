"""State stores: :func:`create_state_store` maps a store's name to its implementation.

May import: no other room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elastic_step.backends.api import JobOwner
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


@dataclass(frozen=True)
class StoreParams:
    """What a store is made from; each store uses what it needs."""

    output_dir: str
    settings: StateStoreSettings
    #: Names the store's objects on a cluster.
    job_name: str | None = None
    namespace: str | None = None
    #: The object that owns the job's objects, so that deleting it removes the state too.
    owner: JobOwner | None = None
    #: Where the cluster's credentials are, outside a pod (None: $KUBECONFIG, ~/.kube/config).
    kubeconfig: str | None = None


def _file_store(params: StoreParams) -> StateStore:
    return FileStateStore(OutputLayout(params.output_dir).state_dir, params.settings)


def _kubernetes_store(params: StoreParams) -> StateStore:
    if not params.job_name:
        raise InputError("the kubernetes state store needs the job's name (job_name)")
    # Imported here: the kubernetes client is needed only by this store.
    from elastic_step.master.state_store.kubernetes_store import KubernetesStateStore

    api_client, namespace = None, params.namespace
    if params.kubeconfig:
        from elastic_step.kube.client import load_api_client

        api_client, found, _ = load_api_client(params.kubeconfig)
        namespace = namespace or found or "default"  # as the backend finds its namespace
    return KubernetesStateStore(
        params.job_name,
        namespace,
        params.settings,
        api_client=api_client,
        owner_reference=_reference_to(params.owner),
    )


def _reference_to(owner: JobOwner | None) -> dict | None:
    """The ownerReference to ``owner`` that the store's objects carry."""
    if owner is None:
        return None
    from elastic_step.backends.kubernetes_pods import owner_reference

    return owner_reference(owner.api_version, owner.kind, owner.name, owner.uid)


_REGISTRY: dict[str, Callable[[StoreParams], StateStore]] = {
    "file": _file_store,
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
    owner: JobOwner | None = None,
    kubeconfig: str | None = None,
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
    params = StoreParams(
        output_dir,
        settings or StateStoreSettings(),
        job_name,
        namespace,
        owner,
        kubeconfig,
    )
    return _REGISTRY[name](params)
