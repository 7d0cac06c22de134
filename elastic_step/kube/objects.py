"""ConfigMaps, Secrets and Leases of one namespace, as JSON dicts, through :mod:`.calls`.

Reads answer None for an object that is not there, a delete of one already gone is no error,
and every other refusal is the caller's :attr:`KubeCalls.error`. What the objects mean is the
caller's business (the state store's: master/state_store/kubernetes_store.py, kube_lease.py).

Tests: tests/unit/test_kube_calls.py; against an API server, tests/k8s/test_k8s_state_store.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from elastic_step.kube.calls import KubeCalls, KubeError

CONFIGMAPS = "configmaps"
SECRETS = "secrets"
LEASES = "leases.coordination.k8s.io"


class KubeObjects(KubeCalls):
    """KubeCalls with the reads and writes of ConfigMaps, Secrets and Leases."""

    # -- Secrets --

    def get_or_create_secret(self, body: dict) -> dict:
        """The Secret named in ``body``, created from ``body`` if there is none (a create
        that lost a race reads the winner's)."""
        name = body["metadata"]["name"]
        try:
            return self._create(SECRETS, self.core.create_namespaced_secret, body)
        except KubeError as err:
            if not err.already_exists:
                raise
        return self.call(
            "get", SECRETS, self.core.read_namespaced_secret, name, self.namespace, object_name=name
        )

    # -- ConfigMaps --

    def get_configmap(self, name: str) -> dict | None:
        """The ConfigMap, or None when there is none by that name."""
        return self._get(CONFIGMAPS, self.core.read_namespaced_config_map, name, None)

    def create_configmap(self, body: dict) -> dict:
        return self._create(CONFIGMAPS, self.core.create_namespaced_config_map, body)

    def patch_configmap(self, name: str, body: dict) -> dict:
        """A strategic merge patch; ``metadata.resourceVersion`` in it is a precondition."""
        return self._patch(CONFIGMAPS, self.core.patch_namespaced_config_map, name, body, None)

    def delete_configmap(self, name: str) -> None:
        """Deletes it; one already gone is no error."""
        try:
            self.call(
                "delete",
                CONFIGMAPS,
                self.core.delete_namespaced_config_map,
                name,
                self.namespace,
                object_name=name,
            )
        except KubeError as err:
            if not err.not_found:
                raise

    def list_configmap_metadata(self, label_selector: str) -> list[dict]:
        """The metadata (no data) of the ConfigMaps that match, in one request."""
        path = "/api/v1/namespaces/{namespace}/configmaps"
        return self.list_metadata(CONFIGMAPS, path, label_selector)

    # -- Leases --

    def get_lease(self, name: str, retry_for_s: float | None = None) -> dict | None:
        """The Lease, or None when there is none by that name."""
        return self._get(LEASES, self.coordination.read_namespaced_lease, name, retry_for_s)

    def create_lease(self, body: dict) -> dict:
        return self._create(LEASES, self.coordination.create_namespaced_lease, body)

    def patch_lease(self, name: str, body: dict, retry_for_s: float | None = None) -> dict:
        return self._patch(
            LEASES, self.coordination.patch_namespaced_lease, name, body, retry_for_s
        )

    def _create(self, resource: str, create: Callable[..., Any], body: dict) -> dict:
        return self.call(
            "create", resource, create, self.namespace, body, object_name=body["metadata"]["name"]
        )

    def _patch(
        self,
        resource: str,
        patch: Callable[..., Any],
        name: str,
        body: dict,
        retry_for_s: float | None,
    ) -> dict:
        return self.call(
            "patch",
            resource,
            patch,
            name,
            self.namespace,
            body,
            object_name=name,
            retry_for_s=retry_for_s,
        )

    def _get(
        self, resource: str, read: Callable[..., Any], name: str, retry_for_s: float | None
    ) -> dict | None:
        try:
            return self.call(
                "get",
                resource,
                read,
                name,
                self.namespace,
                object_name=name,
                retry_for_s=retry_for_s,
            )
        except KubeError as err:
            if err.not_found:
                return None
            raise
