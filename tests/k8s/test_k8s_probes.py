"""Readiness probes decide a pod's Ready condition, and so its place in EndpointSlices."""

from __future__ import annotations

import sys
import uuid

from k8s_helpers import TEST_POD_LABELS, container_log, field_env, wait_for, wait_running
from kubernetes import client

LATE_FLAG = """
import time
time.sleep(2)
open("/ready/flag", "w").write("ok")
time.sleep(600)
"""

LATE_LISTENER = """
import os, socket, time
time.sleep(2)
srv = socket.socket()
srv.bind((os.environ["POD_IP"], 7001))
srv.listen(4)
time.sleep(600)
"""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _container(name: str, script: str, probe: dict, **extra) -> dict:
    return {
        "name": name,
        "image": "local/python",
        "command": [sys.executable, "-c", script],
        "readinessProbe": {"periodSeconds": 1, "failureThreshold": 1, **probe},
        **extra,
    }


def test_readiness_probes_gate_the_ready_condition(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns, name = cluster.namespace, _name("probed")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(TEST_POD_LABELS)},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": "whoami",
                    "image": "local/sh",
                    "command": ["sh", "-c", "echo uid=$(id -u) gid=$(id -g)"],
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1001},
                }
            ],
            "containers": [
                # The flag exists only in the container's own mount namespace: the exec
                # probe must run there to see it.
                _container(
                    "exec",
                    LATE_FLAG,
                    {"exec": {"command": ["cat", "/ready/flag"]}},
                    volumeMounts=[{"name": "ready", "mountPath": "/ready"}],
                ),
                _container(
                    "tcp",
                    LATE_LISTENER,
                    {"tcpSocket": {"port": "serve"}},
                    ports=[{"name": "serve", "containerPort": 7001}],
                    env=[field_env("POD_IP", "status.podIP")],
                ),
            ],
            "volumes": [{"name": "ready", "emptyDir": {}}],
        },
    }
    core.create_namespaced_pod(ns, pod)
    running = wait_running(core, ns, name)

    def conditions(pod: client.V1Pod) -> dict[str, str]:
        return {c.type: c.status for c in pod.status.conditions or []}

    assert conditions(running)["Ready"] == "False"
    assert not any(s.ready for s in running.status.container_statuses)
    ready = wait_for(
        "Ready",
        lambda: (
            (p := core.read_namespaced_pod(name, ns)) and conditions(p)["Ready"] == "True" and p
        ),
        timeout=30,
    )
    assert all(s.ready for s in ready.status.container_statuses)
    # The init container ran as the securityContext's user.
    assert container_log(cluster.workdir, ready, "whoami").strip() == "uid=1000 gid=1001"
