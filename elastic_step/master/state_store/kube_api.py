"""The Kubernetes state store's requests: retries, raw JSON in and out, one-line errors.

Every request goes through :meth:`KubeApi.call`:

* 429, 5xx, timeouts and connection errors are retried with capped exponential backoff for at
  most ``retry_for_s`` seconds; then a :class:`StateStoreError` names the request and why;
* 403 becomes one line naming the verb, the resource and the namespace (and the Role to check);
* other refusals (404, 409, 422, ...) raise :class:`ApiError`, a StateStoreError that keeps the
  status and the API's reason (``NotFound``, ``AlreadyExists``, ``Conflict``) for the caller.

Bodies are plain dicts and responses are parsed JSON (not the client's model classes): a
journal chunk near 1 MiB parses in milliseconds this way.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from elastic_step.master.state_store.api import StateStoreError

log = logging.getLogger("elastic_step.master.state_store")

CONFIGMAPS = "configmaps"
SECRETS = "secrets"
LEASES = "leases.coordination.k8s.io"
RBAC_HINT = "check the Role in manifests/rbac.yaml"
RETRYABLE = frozenset({0, 429, 500, 502, 503, 504})  # 0: the client's SSL/connection failure
_FIRST_PAUSE_S = 0.05
_MAX_PAUSE_S = 2.0
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class ApiError(StateStoreError):
    """The API server refused a request for a reason a retry does not fix."""

    def __init__(self, message: str, status: int, reason: str) -> None:
        super().__init__(message)
        self.status = status
        #: The Status object's reason: NotFound, AlreadyExists, Conflict, Invalid, ...
        self.reason = reason

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        """A resourceVersion precondition failed: someone else changed the object."""
        return self.status == 409 and self.reason != "AlreadyExists"


def _status_of(err: ApiException) -> tuple[str, str]:
    """The reason and message of the Status object in an error's body."""
    body = err.body
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        status = json.loads(body or "")
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return str(err.reason or ""), str(err.reason or f"HTTP {err.status}")
    return str(status.get("reason") or err.reason or ""), str(status.get("message") or err.reason)


class KubeApi:
    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        request_timeout_s: float,
        retry_for_s: float,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._timeout = (min(5.0, request_timeout_s), request_timeout_s)
        self.retry_for_s = retry_for_s

    def call(
        self,
        verb: str,
        resource: str,
        name: str | None,
        request: Callable[..., Any],
        *args: Any,
        retry_for_s: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Runs ``request(*args, **kwargs)`` with retries; returns the response's parsed JSON.

        ``verb`` and ``resource`` are RBAC's words (``patch``, ``configmaps``), for messages.
        """
        what = f"{resource}/{name}" if name else resource
        budget = self.retry_for_s if retry_for_s is None else retry_for_s
        deadline = time.monotonic() + budget
        pause = _FIRST_PAUSE_S
        attempts = 0
        while True:
            attempts += 1
            try:
                response = request(
                    *args, _preload_content=False, _request_timeout=self._timeout, **kwargs
                )
                try:
                    data = response.data
                finally:
                    response.release_conn()
                return json.loads(data) if data else None
            except ApiException as err:
                reason, message = _status_of(err)
                if err.status == 403:
                    raise StateStoreError(
                        f"forbidden: cannot {verb} {resource} in namespace {self.namespace} "
                        f"({RBAC_HINT})"
                    ) from None
                if err.status == 401:
                    raise StateStoreError(
                        f"unauthorized: the API server rejected this process's credentials "
                        f"when it tried to {verb} {what} in namespace {self.namespace}"
                    ) from None
                if err.status not in RETRYABLE:
                    raise ApiError(
                        f"cannot {verb} {what} in namespace {self.namespace}: {message}",
                        err.status,
                        reason,
                    ) from None
                why = f"{err.status} {message}"
                wait = _retry_after(err)
            except (urllib3.exceptions.HTTPError, OSError) as err:
                why, wait = f"{type(err).__name__}: {err}", None
            left = deadline - time.monotonic()
            if left <= 0:
                raise StateStoreError(
                    f"cannot {verb} {what} in namespace {self.namespace}: {why} "
                    f"({attempts} attempts in {budget:g} s)"
                ) from None
            log.debug("retrying %s %s after %s", verb, what, why)
            time.sleep(min(wait if wait is not None else pause, left))
            pause = min(pause * 2, _MAX_PAUSE_S)

    # -- Secrets --

    def get_or_create_secret(self, body: dict) -> dict:
        """The Secret named in ``body``, created from ``body`` if there is none (a create
        that lost a race reads the winner's)."""
        name = body["metadata"]["name"]
        try:
            return self.call(
                "create", SECRETS, name, self.core.create_namespaced_secret, self.namespace, body
            )
        except ApiError as err:
            if not err.already_exists:
                raise
        return self.call(
            "get", SECRETS, name, self.core.read_namespaced_secret, name, self.namespace
        )

    # -- ConfigMaps --

    def get_configmap(self, name: str) -> dict | None:
        """The ConfigMap, or None when there is none by that name."""
        try:
            return self.call(
                "get",
                CONFIGMAPS,
                name,
                self.core.read_namespaced_config_map,
                name,
                self.namespace,
            )
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def create_configmap(self, body: dict) -> dict:
        return self.call(
            "create",
            CONFIGMAPS,
            body["metadata"]["name"],
            self.core.create_namespaced_config_map,
            self.namespace,
            body,
        )

    def patch_configmap(self, name: str, body: dict) -> dict:
        """A strategic merge patch; ``metadata.resourceVersion`` in it is a precondition."""
        return self.call(
            "patch",
            CONFIGMAPS,
            name,
            self.core.patch_namespaced_config_map,
            name,
            self.namespace,
            body,
        )

    def delete_configmap(self, name: str) -> None:
        """Deletes it; one already gone is no error."""
        try:
            self.call(
                "delete",
                CONFIGMAPS,
                name,
                self.core.delete_namespaced_config_map,
                name,
                self.namespace,
            )
        except ApiError as err:
            if not err.not_found:
                raise

    def list_configmap_metadata(self, label_selector: str) -> list[dict]:
        """The metadata (no data) of the ConfigMaps that match, in one request."""

        def request(**kwargs: Any) -> Any:
            return self.api_client.call_api(
                "/api/v1/namespaces/{namespace}/configmaps",
                "GET",
                {"namespace": self.namespace},
                [("labelSelector", label_selector)],
                {"Accept": _METADATA_LIST},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                **kwargs,
            )

        listed = self.call("list", CONFIGMAPS, None, request)
        return [item["metadata"] for item in listed.get("items") or []]

    # -- Leases --

    def get_lease(self, name: str, retry_for_s: float | None = None) -> dict | None:
        try:
            return self.call(
                "get",
                LEASES,
                name,
                self.coordination.read_namespaced_lease,
                name,
                self.namespace,
                retry_for_s=retry_for_s,
            )
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def create_lease(self, body: dict) -> dict:
        return self.call(
            "create",
            LEASES,
            body["metadata"]["name"],
            self.coordination.create_namespaced_lease,
            self.namespace,
            body,
        )

    def patch_lease(self, name: str, body: dict, retry_for_s: float | None = None) -> dict:
        return self.call(
            "patch",
            LEASES,
            name,
            self.coordination.patch_namespaced_lease,
            name,
            self.namespace,
            body,
            retry_for_s=retry_for_s,
        )


def _retry_after(err: ApiException) -> float | None:
    """The server's Retry-After (429, 503), capped; None when it sent none."""
    headers = err.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return min(float(value), _MAX_PAUSE_S) if value is not None else None
    except ValueError:
        return None
