"""Build a pod container's environment and argv the way the kubelet does.

Pure functions over the pod as a JSON dict (camelCase keys, as the API serves it), so that
the process kubelet and its tests share one implementation of the downward API and of
Kubernetes' $(VAR) expansion.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

HOST_IP = "127.0.0.1"  # the node's address; pods get their own 127.x.y.z (status.podIP)
POD_IP = HOST_IP  # what status.podIP reads as before the kubelet has assigned an address

Pod = Mapping[str, Any]
# (kind, namespace, name, key) -> value or None; kind is "configMap" or "secret".
RefLookup = Callable[[str, str, str, str | None], dict[str, str] | str | None]

#: A quantity's suffixes: decimal ones (k is 1000) and binary ones (Ki is 1024), as Kubernetes'
#: resource.Quantity reads them.
_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    **{suffix: Decimal(1000**power) for power, suffix in enumerate("kMGTPE", 1)},
    **{f"{suffix}i": Decimal(1024**power) for power, suffix in enumerate("KMGTPE", 1)},
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def parse_quantity(text: str) -> Decimal:
    """Parse a resource quantity such as "500m", "2", or "1Gi"."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"bad quantity {text!r}")
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined names are replaced, $$ escapes, others stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(replace, text)


def field_ref(pod: Pod, path: str) -> str:
    """Resolve a downward-API fieldRef path against the pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status") or {}
    pod_ip = status.get("podIP") or POD_IP
    host_ip = status.get("hostIP") or HOST_IP
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []) or pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []) or host_ip,
    }
    if path in simple:
        return simple[path]
    keyed = _FIELD_KEY.match(path)
    if keyed:
        return (meta.get(keyed.group(1)) or {}).get(keyed.group(2), "")
    raise ValueError(f"unsupported fieldRef {path!r}")


def resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """Resolve requests/limits of cpu or memory, rounded up by the divisor, like the kubelet."""
    section, _, resource = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(section) or {}).get(resource)
    if value is None and section == "requests":
        value = (resources.get("limits") or {}).get(resource)
    if value is None:
        return "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(parse_quantity(value) / divisor))


def container_env(
    pod: Pod,
    container: Mapping[str, Any],
    base: Mapping[str, str],
    lookup: RefLookup | None = None,
) -> dict[str, str]:
    """The container's environment: base, then envFrom, then env (each may use earlier vars)."""
    namespace = pod.get("metadata", {}).get("namespace", "")
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind in ("configMap", "secret"):
            ref = source.get(f"{kind}Ref")
            if ref and lookup:
                values = lookup(kind, namespace, ref["name"], None) or {}
                assert isinstance(values, dict)
                env.update({prefix + k: v for k, v in values.items()})
    for var in container.get("env") or []:
        name = var["name"]
        if "value" in var:
            env[name] = expand(var["value"], env)
            continue
        source = var.get("valueFrom") or {}
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = resource_field_ref(container, source["resourceFieldRef"])
        elif lookup and ("configMapKeyRef" in source or "secretKeyRef" in source):
            kind = "configMap" if "configMapKeyRef" in source else "secret"
            ref = source[f"{kind}KeyRef"]
            value = lookup(kind, namespace, ref["name"], ref["key"])
            if value is None and not ref.get("optional"):
                raise ValueError(f"{kind} {ref['name']!r} key {ref['key']!r} not found")
            if value is not None:
                env[name] = str(value)
        else:
            env.setdefault(name, "")
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) expanded; images are not run, so a command is required."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if not container.get("command"):
        raise ValueError("the process kubelet needs an explicit container command")
    return [expand(part, env) for part in argv]


def service_env(host: str, port: int) -> dict[str, str]:
    """The variables the kubelet gives every container for the "kubernetes" Service.

    In a real cluster they name the Service's ClusterIP and port 443; here they name the
    apiserver's own loopback address, so that load_incluster_config() works unchanged.
    """
    url = f"tcp://{host}:{port}"
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": url,
        f"KUBERNETES_PORT_{port}_TCP": url,
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port),
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


def pod_hostname(pod: Pod) -> str:
    """spec.hostname, else the pod's name (at most 63 characters, as the kubelet cuts it)."""
    spec, meta = pod.get("spec", {}), pod.get("metadata", {})
    return (spec.get("hostname") or meta.get("name", ""))[:63].rstrip("-.")


def resolv_conf(pod: Pod, nameserver: str, domain: str, host_resolv: str) -> str | None:
    """The pod's /etc/resolv.conf by dnsPolicy; None keeps the host's file."""
    spec = pod.get("spec", {})
    namespace = pod.get("metadata", {}).get("namespace", "")
    policy = spec.get("dnsPolicy") or "ClusterFirst"
    if policy == "ClusterFirst" and spec.get("hostNetwork"):
        policy = "Default"  # as the kubelet does: host-network pods keep the host's DNS
    nameservers: list[str] = []
    searches: list[str] = []
    options: dict[str, str | None] = {}
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet"):
        nameservers = [nameserver]
        searches = [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]
        options = {"ndots": "5"}
    elif policy == "Default":
        if not spec.get("dnsConfig"):
            return None
        for line in host_resolv.splitlines():
            words = line.split()
            if words and words[0] == "nameserver":
                nameservers += words[1:2]
            elif words and words[0] in ("search", "domain"):
                searches += words[1:]
            elif words and words[0] == "options":
                for opt in words[1:]:
                    key, _, value = opt.partition(":")
                    options[key] = value or None
    config = spec.get("dnsConfig") or {}
    nameservers += [n for n in config.get("nameservers") or [] if n not in nameservers]
    searches += [s for s in config.get("searches") or [] if s not in searches]
    for opt in config.get("options") or []:
        options[opt["name"]] = opt.get("value")
    lines = []
    if searches:
        lines.append("search " + " ".join(searches))
    lines += [f"nameserver {n}" for n in nameservers[:3]]
    if options:
        lines.append(
            "options " + " ".join(k if v is None else f"{k}:{v}" for k, v in options.items())
        )
    return "\n".join(lines) + "\n"


def hosts_file(pod: Pod, pod_ip: str, domain: str) -> str:
    """The kubelet-managed /etc/hosts: localhost, the pod's own name, hostAliases."""
    spec = pod.get("spec", {})
    namespace = pod.get("metadata", {}).get("namespace", "")
    hostname = pod_hostname(pod)
    lines = [
        "# Kubernetes-managed hosts file (process kubelet).",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        "fe00::0\tip6-localnet",
        "fe00::0\tip6-mcastprefix",
        "fe00::1\tip6-allnodes",
        "fe00::2\tip6-allrouters",
    ]
    if spec.get("subdomain"):
        fqdn = f"{hostname}.{spec['subdomain']}.{namespace}.svc.{domain}"
        lines.append(f"{pod_ip}\t{fqdn}\t{hostname}")
    else:
        lines.append(f"{pod_ip}\t{hostname}")
    for alias in spec.get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t" + "\t".join(alias.get("hostnames") or []))
    return "\n".join(lines) + "\n"
