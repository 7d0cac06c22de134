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

POD_IP = "127.0.0.1"  # every pod process lives on loopback

Pod = Mapping[str, Any]
# (kind, namespace, name, key) -> value or None; kind is "configMap" or "secret".
RefLookup = Callable[[str, str, str, str | None], dict[str, str] | str | None]

_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
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
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": POD_IP,
        "status.podIPs": POD_IP,
        "status.hostIP": POD_IP,
        "status.hostIPs": POD_IP,
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
