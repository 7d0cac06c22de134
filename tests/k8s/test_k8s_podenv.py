"""The process kubelet's downward API and $(VAR) expansion, without a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from podenv import container_argv, container_env, expand, parse_quantity

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
