"""The process kubelet's downward API and $(VAR) expansion, without a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from podenv import (
    container_argv,
    container_env,
    expand,
    hosts_file,
    parse_quantity,
    resolv_conf,
    service_env,
)

POD = {
    "metadata": {"name": "w-0", "namespace": "ns", "uid": "u-1", "labels": {"role": "worker"}},
    "spec": {"nodeName": "node-1", "serviceAccountName": "sa"},
}


def _ref(path: str) -> dict:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def test_downward_api_fields() -> None:
    container = {
        "command": ["run"],
        "env": [
            {"name": "NAME", **_ref("metadata.name")},
            {"name": "NS", **_ref("metadata.namespace")},
            {"name": "UID", **_ref("metadata.uid")},
            {"name": "IP", **_ref("status.podIP")},
            {"name": "NODE", **_ref("spec.nodeName")},
            {"name": "ROLE", **_ref("metadata.labels['role']")},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
        "resources": {"limits": {"cpu": "1500m"}},
    }
    env = container_env(POD, container, {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "NAME": "w-0",
        "NS": "ns",
        "UID": "u-1",
        "IP": "127.0.0.1",
        "NODE": "node-1",
        "ROLE": "worker",
        "CPU": "2",
    }


def test_var_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "x"}
    assert expand("$(A)-$(B)-$$(A)", env) == "x-$(B)-$(A)"
    container = {
        "command": ["echo", "$(GREETING)"],
        "args": ["$(A)"],
        "env": [{"name": "GREETING", "value": "hi $(A)"}],
    }
    assert container_argv(container, container_env(POD, container, env)) == ["echo", "hi x", "x"]


def test_a_command_is_required() -> None:
    with pytest.raises(ValueError, match="explicit container command"):
        container_argv({"args": ["x"]}, {})


def test_quantities() -> None:
    assert parse_quantity("500m") * 2 == 1
    assert parse_quantity("1Gi") == 2**30
    with pytest.raises(ValueError):
        parse_quantity("1Qi")


def test_pod_ip_comes_from_the_status_the_kubelet_fills_in() -> None:
    pod = {**POD, "status": {"podIP": "127.1.0.9", "podIPs": [{"ip": "127.1.0.9"}]}}
    container = {"command": ["run"], "env": [{"name": "IP", **_ref("status.podIP")}]}
    assert container_env(pod, container, {})["IP"] == "127.1.0.9"


def test_service_env_names_the_apiserver() -> None:
    env = service_env("127.0.0.1", 6443)
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == env["KUBERNETES_SERVICE_PORT_HTTPS"] == "6443"
    assert env["KUBERNETES_PORT_6443_TCP"] == "tcp://127.0.0.1:6443"


def test_resolv_conf_by_dns_policy() -> None:
    host = "nameserver 10.9.9.9\nsearch corp.example\noptions edns0\n"
    assert resolv_conf(POD, "127.1.255.53", "cluster.local", host) == (
        "search ns.svc.cluster.local svc.cluster.local cluster.local\n"
        "nameserver 127.1.255.53\n"
        "options ndots:5\n"
    )
    host_net = {**POD, "spec": {**POD["spec"], "hostNetwork": True}}
    assert resolv_conf(host_net, "127.1.255.53", "cluster.local", host) is None  # the host's
    custom = {
        **POD,
        "spec": {
            "dnsPolicy": "None",
            "dnsConfig": {
                "nameservers": ["127.0.0.9"],
                "options": [{"name": "ndots", "value": "1"}],
            },
        },
    }
    assert resolv_conf(custom, "127.1.255.53", "cluster.local", host) == (
        "nameserver 127.0.0.9\noptions ndots:1\n"
    )


def test_hosts_file_names_the_pod() -> None:
    pod = {**POD, "spec": {"hostname": "ps-0", "subdomain": "ps"}}
    text = hosts_file(pod, "127.1.0.4", "cluster.local")
    assert "127.0.0.1\tlocalhost" in text
    assert "127.1.0.4\tps-0.ps.ns.svc.cluster.local\tps-0" in text
    assert "127.1.0.4\tw-0" in hosts_file(POD, "127.1.0.4", "cluster.local")
