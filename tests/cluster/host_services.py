"""A host process as a cluster Service: what a Deployment behind a Service is in a real
cluster, for the servers the tests run on the host (ML Metadata, KFP's API server, the S3
server as KFP's object store).

Pods reach them by the names and ports that the real software hard-codes (for example
``metadata-grpc-service.<ns>.svc.cluster.local:8080``): a headless Service without a
selector, and an EndpointSlice that holds one address of the cluster's service range (the
last /24 of the pod block, which the kubelet never gives a pod). The cluster DNS answers the
Service's name with that address, and the host process listens on it. There is no
kube-proxy, so the port a client dials is the port the process listens on.
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Mapping

from kubernetes import client

#: The label by which EndpointSlices name their Service (as the endpointslice controller's).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY = "host-services.elastic-step.test"


def service_range(pod_cidr: str) -> ipaddress.IPv4Network | None:
    """The cluster's service range: the pod block's last /24 (the kubelet gives no pod an
    address there), or None for a block no larger than a /24."""
    network = ipaddress.IPv4Network(pod_cidr)
    if network.prefixlen >= 24:
        return None
    *_, services = network.subnets(new_prefix=24)
    return services


def service_address(pod_cidr: str, index: int) -> str:
    """The ``index``-th address of the cluster's service range (1..254; 53 is the DNS)."""
    services = service_range(pod_cidr)
    if services is None or not 1 <= index <= 254 or index == 53:
        raise ValueError(
            f"service address {index} of {pod_cidr}: must be 1..254 and not 53, "
            "in a block larger than a /24"
        )
    return str(services[index])


def publish(
    api: client.ApiClient,
    namespace: str,
    name: str,
    address: str,
    ports: Mapping[str, int],
) -> None:
    """Service ``name`` in ``namespace`` resolves to ``address``, with ``ports`` by name.
    Creates the namespace if it is missing; replaces an earlier publication of the name."""
    core = client.CoreV1Api(api)
    with contextlib.suppress(client.rest.ApiException):  # 409: it exists
        core.create_namespace({"metadata": {"name": namespace}})
    service_ports = [
        {"name": port_name, "port": port, "protocol": "TCP"} for port_name, port in ports.items()
    ]
    discovery = client.DiscoveryV1Api(api)
    with contextlib.suppress(client.rest.ApiException):  # 404: not published before
        core.delete_namespaced_service(name, namespace)
    with contextlib.suppress(client.rest.ApiException):
        discovery.delete_namespaced_endpoint_slice(name, namespace)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"clusterIP": "None", "ports": service_ports},
        },
    )
    discovery.create_namespaced_endpoint_slice(
        namespace,
        {
            "metadata": {
                "name": name,
                "labels": {
                    SERVICE_NAME_LABEL: name,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": service_ports,
        },
    )
