"""Calls to the Kubernetes API for the backend: configuration, bounded retries, one-line errors.

Every call names what it does (verb, resource, namespace), so that a refusal reads as one
line, for example ``cannot create pods in namespace "ml": forbidden: User
"system:serviceaccount:ml:elastic-step-master" cannot create resource "pods" ...``. Objects
are read and written as JSON dicts (``_preload_content=False``), as the API serves them.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import random
import socket
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from elastic_step.backends.api import BackendError
from elastic_step.errors import ElasticStepError, InputError

log = logging.getLogger(__name__)

#: Seconds to connect, and to wait for an answer, for one ordinary call.
REQUEST_TIMEOUT = (5.0, 20.0)
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeCallError(BackendError, ElasticStepError):
    """A refused or failed API call; ``str()`` is one line naming verb, resource, namespace.

    Also an :class:`ElasticStepError`: one that ends the master (a Forbidden while it sets up
    its Service, say) is printed as that one line, not as a traceback."""

    def __init__(
        self,
        verb: str,
        resource: str,
        namespace: str,
        status: int | None,
        detail: str,
        retry_after_s: float | None = None,
    ) -> None:
        self.verb, self.resource, self.namespace = verb, resource, namespace
        #: The HTTP status; None when no answer came (a timeout, a refused connection).
        self.status = status
        self.detail = " ".join(detail.split())
        self.retry_after_s = retry_after_s
        super().__init__(self._line())

    def _line(self) -> str:
        where = f'cannot {self.verb} {self.resource} in namespace "{self.namespace}"'
        if self.status is None:
            return f"{where}: no answer from the API server ({self.detail})"
        if self.forbidden:
            hint = " (the master's Role lacks it: see manifests/rbac.yaml)"
            if "PodSecurity" in self.detail:
                hint = " (the namespace's Pod Security admission refused it)"
            return f"{where}: forbidden: {self.detail}{hint}"
        return f"{where}: HTTP {self.status}: {self.detail}"

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer, a server error, or too many requests."""
        return self.status is None or self.status >= 500 or self.status == 429

    @property
    def capacity(self) -> bool:
        """Refused for now for lack of quota: retry later."""
        return self.status == 403 and ("exceeded quota" in self.detail or "quota" in self.detail)

    @property
    def forbidden(self) -> bool:
        return self.status == 403 and not self.capacity

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _detail(e: ApiException) -> str:
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else e.body
    try:
        return json.loads(body).get("message") or e.reason or ""
    except (TypeError, ValueError, AttributeError):
        return str(e.reason or body or "")


def _retry_after(e: ApiException) -> float | None:
    try:
        return float((e.headers or {}).get("Retry-After"))
    except (TypeError, ValueError):
        return None


def backoff_s(attempt: int, first_s: float = 0.5, cap_s: float = 10.0) -> float:
    """Capped exponential backoff with jitter; ``attempt`` counts from 1."""
    return min(cap_s, first_s * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)


@dataclass
class Kube:
    """The core API of one namespace, with errors turned into :class:`KubeCallError`."""

    core: client.CoreV1Api
    namespace: str

    def call(
        self,
        verb: str,
        resource: str,
        method: Callable[..., Any],
        *args: Any,
        retry_for_s: float = 0.0,
        timeout: tuple[float, float] = REQUEST_TIMEOUT,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Calls ``method`` and returns the answer as a dict. Transient failures are retried
        with a capped backoff for up to ``retry_for_s`` seconds."""
        deadline = time.monotonic() + retry_for_s
        attempt = 0
        while True:
            attempt += 1
            try:
                response = method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
                data = response.data
                return json.loads(data) if data else {}
            except ApiException as e:
                error = KubeCallError(
                    verb, resource, self.namespace, e.status, _detail(e), _retry_after(e)
                )
            except (urllib3.exceptions.HTTPError, OSError) as e:
                error = KubeCallError(verb, resource, self.namespace, None, str(e) or repr(e))
            delay = error.retry_after_s or backoff_s(attempt)
            if not error.transient or time.monotonic() + delay > deadline:
                raise error
            log.debug("%s; retrying in %.1f s", error, delay)
            time.sleep(delay)


def load_api_client(kubeconfig: str | None) -> tuple[client.ApiClient, str | None, bool]:
    """(client, default namespace or None, in a pod?): in-cluster configuration inside a pod
    (``KUBERNETES_SERVICE_HOST`` set) unless ``kubeconfig`` is given; a kubeconfig otherwise
    (``kubeconfig``, or ``$KUBECONFIG``, or ``~/.kube/config``). InputError if neither works."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise InputError(f"cannot use the in-cluster Kubernetes configuration: {e}") from e
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                namespace = f.read().strip() or None
        except OSError:
            namespace = None
        return client.ApiClient(configuration), namespace, True
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        _, context = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError, TypeError) as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise InputError(f"cannot load the kubeconfig {where}: {e}") from e
    namespace = (context or {}).get("context", {}).get("namespace")
    return client.ApiClient(configuration), namespace, False


def address_toward(api_client: client.ApiClient) -> str:
    """This machine's address on the way to the API server: 127.0.0.1 when the server is on
    loopback (a local test cluster), else the source address the route to it picks."""
    host = urllib.parse.urlparse(api_client.configuration.host).hostname or "127.0.0.1"
    try:
        target = socket.getaddrinfo(host, 443, type=socket.SOCK_DGRAM)[0][4][0]
        if ipaddress.ip_address(target).is_loopback:
            return "127.0.0.1"
        family = socket.AF_INET6 if ":" in target else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((target, 443))  # UDP: picks a route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()
