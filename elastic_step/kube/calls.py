"""Calls to the Kubernetes API: one retry policy, raw JSON in and out, one-line errors.

Every call of the backend and the state store goes through :meth:`KubeCalls.call`:

* no answer (a timeout, a refused connection, the client's own SSL failure), 429 and 5xx are
  retried for at most ``retry_for_s`` seconds, after the server's Retry-After or else after
  the one backoff policy below; then the error is raised;
* every other refusal is raised at once, as :class:`KubeError`: one line naming the verb, the
  resource and the namespace, for example ``cannot create pods in namespace "ml": forbidden:
  User "system:serviceaccount:ml:elastic-step-master" cannot create resource "pods" ...
  (the master's Role lacks it: see manifests/rbac.yaml)``. It keeps the HTTP status and the
  Status object's reason, so callers tell not_found, already_exists and conflict apart.

Bodies are plain dicts and answers are parsed JSON (``_preload_content=False``), not the
client's model classes: a journal chunk near 1 MiB parses in milliseconds this way.

Tests: tests/unit/test_kube_calls.py.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from elastic_step.errors import ElasticStepError

log = logging.getLogger(__name__)

#: Seconds to connect, and to wait for an answer, for one ordinary call.
REQUEST_TIMEOUT = (5.0, 20.0)
#: The one retry policy (as client-go names one and every caller uses it): pauses from
#: RETRY_FIRST_S doubling up to RETRY_CAP_S, jittered, or the server's Retry-After (at most
#: RETRY_AFTER_CAP_S), until the caller's retry_for_s runs out; then one last try.
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 2.0
RETRY_AFTER_CAP_S = 10.0
RBAC_HINT = "the master's Role lacks it: see manifests/rbac.yaml"
#: Asks a list for each object's metadata only (a PartialObjectMetadataList).
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def backoff_s(attempt: int, first_s: float = 0.5, cap_s: float = 10.0) -> float:
    """The one backoff: capped exponential with ±20 % jitter (so that many clients that failed
    together do not retry together); ``attempt`` counts from 1."""
    return min(cap_s, first_s * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)


class KubeError(ElasticStepError):
    """A refused or failed API call; ``str()`` is one line naming verb, resource, namespace.

    An :class:`ElasticStepError`: one that ends the master is printed as that one line. The
    backend and the state store raise subclasses that are also their own API's errors."""

    def __init__(
        self,
        verb: str,
        resource: str,
        namespace: str,
        status: int | None,
        detail: str,
        *,
        reason: str = "",
        name: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(verb, resource, namespace, status, detail)
        #: RBAC's words (``patch``, ``configmaps``), and the object's name when there is one.
        self.verb, self.resource, self.namespace, self.name = verb, resource, namespace, name
        #: The HTTP status; None when no answer came (0 is the client's own SSL failure).
        self.status = status or None
        self.detail = " ".join(str(detail).split())
        #: The Status object's reason: NotFound, AlreadyExists, Conflict, Invalid, ...
        self.reason = reason
        self.retry_after_s = retry_after_s
        #: Set when the call gave up after retrying.
        self.attempts = 1
        self.retried_for_s = 0.0

    def __str__(self) -> str:
        # Forbidden is a matter of verb and resource (RBAC), not of one object's name.
        what = f"{self.resource}/{self.name}" if self.name and not self.forbidden else self.resource
        where = f'cannot {self.verb} {what} in namespace "{self.namespace}"'
        if self.status is None:
            why = f"no answer from the API server ({self.detail})"
        elif self.status == 401:
            why = "unauthorized: the API server rejected this process's credentials"
        elif self.forbidden:
            hint = RBAC_HINT
            if "PodSecurity" in self.detail:
                hint = "the namespace's Pod Security admission refused it"
            elif "admission-policy.yaml" in self.detail:
                hint = "elastic-step's admission policy refused it"
            why = f"forbidden: {self.detail} ({hint})"
        else:
            why = f"HTTP {self.status}: {self.detail}"
        tried = ""
        if self.attempts > 1:
            tried = f" ({self.attempts} attempts in {self.retried_for_s:g} s)"
        return f"{where}: {why}{tried}"

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer, a server error, or too many requests."""
        return self.status is None or self.status >= 500 or self.status == 429

    @property
    def capacity(self) -> bool:
        """Refused for now for lack of quota: retry later."""
        return self.status == 403 and "quota" in self.detail

    @property
    def forbidden(self) -> bool:
        return self.status == 403 and not self.capacity

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def conflict(self) -> bool:
        """A precondition (resourceVersion, uid) failed: someone else changed the object."""
        return self.status == 409 and self.reason != "AlreadyExists"


def _status_of(err: ApiException) -> tuple[str, str]:
    """The reason and message of the Status object in an error's body."""
    body = err.body.decode(errors="replace") if isinstance(err.body, bytes) else err.body
    try:
        status = json.loads(body or "")
    except (TypeError, ValueError):
        status = None
    if not isinstance(status, dict):
        return str(err.reason or ""), str(err.reason or body or f"HTTP {err.status}")
    return str(status.get("reason") or err.reason or ""), str(status.get("message") or err.reason)


def _retry_after(err: ApiException) -> float | None:
    """The server's Retry-After (429, 503) in seconds; None when it sent none."""
    headers = err.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def pod_delete_options(*, uid: str | None, grace_s: int) -> client.V1DeleteOptions:
    """A pod delete with ``grace_s`` seconds to stop; with ``uid``, only of that pod (409
    Conflict when the name is another pod's now)."""
    return client.V1DeleteOptions(
        grace_period_seconds=grace_s,
        preconditions=client.V1Preconditions(uid=uid) if uid else None,
    )


class KubeCalls:
    """The API of one namespace, called through :meth:`call`.

    ``timeout`` is (connect, read) seconds for one request; ``retry_for_s`` how long a call
    retries transient failures unless it says otherwise. Subclasses set :attr:`error` to the
    KubeError subclass their callers expect."""

    error: type[KubeError] = KubeError

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        retry_for_s: float = 0.0,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.timeout = timeout
        self.retry_for_s = retry_for_s
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)

    def call(
        self,
        verb: str,
        resource: str,
        method: Callable[..., Any],
        *args: Any,
        object_name: str | None = None,
        retry_for_s: float | None = None,
        timeout: tuple[float, float] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Calls ``method(*args, **kwargs)`` and returns the answer's parsed JSON ({} when it
        is empty). ``verb`` and ``resource`` are RBAC's words, and ``object_name`` the
        object's, for messages. Raises :attr:`error`."""
        budget = self.retry_for_s if retry_for_s is None else retry_for_s
        deadline = time.monotonic() + budget
        attempt = 0
        while True:
            attempt += 1
            try:
                response = method(
                    *args,
                    _preload_content=False,
                    _request_timeout=timeout or self.timeout,
                    **kwargs,
                )
                try:
                    data = response.data
                finally:
                    response.release_conn()
                return json.loads(data) if data else {}
            except ApiException as e:
                reason, message = _status_of(e)
                error = self.error(
                    verb,
                    resource,
                    self.namespace,
                    e.status,
                    message,
                    reason=reason,
                    name=object_name,
                    retry_after_s=_retry_after(e),
                )
            except (urllib3.exceptions.HTTPError, OSError) as e:
                detail = f"{type(e).__name__}: {e}"
                error = self.error(verb, resource, self.namespace, None, detail, name=object_name)
            left = deadline - time.monotonic()
            if not error.transient or left <= 0:
                if attempt > 1:
                    error.attempts, error.retried_for_s = attempt, budget
                raise error from None
            pause = error.retry_after_s
            if pause is None:
                pause = backoff_s(attempt, RETRY_FIRST_S, RETRY_CAP_S)
            pause = min(pause, RETRY_AFTER_CAP_S, left)
            log.debug("%s; retrying in %.2f s", error, pause)
            time.sleep(pause)

    def read_pod(self, name: str) -> dict[str, Any]:
        """The pod ``name`` of the namespace, retrying transient failures for 30 s."""
        return self.call(
            "get",
            "pods",
            self.core.read_namespaced_pod,
            name,
            self.namespace,
            object_name=name,
            retry_for_s=30,
        )

    def create_pod(self, body: dict) -> dict[str, Any]:
        return self.call(
            "create",
            "pods",
            self.core.create_namespaced_pod,
            self.namespace,
            body,
            object_name=body["metadata"]["name"],
        )

    def delete_pod(self, name: str, *, uid: str | None, grace_s: int) -> dict[str, Any]:
        """Deletes pod ``name`` as :func:`pod_delete_options` says."""
        return self.call(
            "delete",
            "pods",
            self.core.delete_namespaced_pod,
            name,
            self.namespace,
            object_name=name,
            body=pod_delete_options(uid=uid, grace_s=grace_s),
        )

    def list_metadata(self, resource: str, path: str, label_selector: str) -> list[dict]:
        """The metadata (no data) of the objects at ``path`` (``{namespace}`` in it is filled
        in) that match ``label_selector``, in one request."""

        def request(**kwargs: Any) -> Any:
            return self.api_client.call_api(
                path,
                "GET",
                {"namespace": self.namespace},
                [("labelSelector", label_selector)],
                {"Accept": METADATA_LIST},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                **kwargs,
            )

        listed = self.call("list", resource, request)
        return [item["metadata"] for item in listed.get("items") or []]
