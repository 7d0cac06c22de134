"""The one place that constructs Kubernetes API clients, and finds the default namespace.

Inside a pod (``KUBERNETES_SERVICE_HOST`` set) its ServiceAccount's in-cluster configuration,
unless a kubeconfig is named; elsewhere a kubeconfig: the one named, else ``$KUBECONFIG``
(read at each call: the client reads it once, when it is imported), else ``~/.kube/config``.

Tests: tests/unit/test_kube_client.py (which also checks that no other module of
elastic_step constructs a client).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse

from kubernetes import client, config

from elastic_step.errors import InputError

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def load_api_client(kubeconfig: str | None) -> tuple[client.ApiClient, str | None, bool]:
    """(client, default namespace or None, in a pod?). InputError if no configuration works."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as e:
            raise InputError(f"cannot use the in-cluster Kubernetes configuration: {e}") from e
        return client.ApiClient(configuration), pod_namespace(), True
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (config.ConfigException, OSError, TypeError) as e:
        raise InputError(f"cannot load the kubeconfig {kubeconfig or '~/.kube/config'}: {e}") from e
    return client.ApiClient(configuration), context_namespace(kubeconfig), False


def default_namespace(kubeconfig: str | None = None) -> str | None:
    """The pod's own namespace; elsewhere the kubeconfig's current context's; else None."""
    return pod_namespace() or context_namespace(kubeconfig)


def pod_namespace() -> str | None:
    """The namespace of this pod's ServiceAccount; None outside a pod."""
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or None
    except OSError:
        return None


def context_namespace(kubeconfig: str | None = None) -> str | None:
    """The namespace of the kubeconfig's current context (``kubeconfig``, else
    ``$KUBECONFIG``, else ``~/.kube/config``); None when it names none or cannot be read."""
    try:
        _, context = config.list_kube_config_contexts(
            config_file=kubeconfig or os.environ.get("KUBECONFIG") or None
        )
    except (config.ConfigException, OSError, TypeError):
        return None
    return (context or {}).get("context", {}).get("namespace") or None


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
