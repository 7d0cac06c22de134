"""Volumes at their mount paths, in each container's own mount namespace."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from k8s_helpers import (
    TEST_POD_LABELS,
    bound_claim,
    container_log,
    last_json_line,
    python_pod,
    wait_for,
    wait_terminal,
)
from kubernetes import client
from kubernetes.client.rest import ApiException

#: The pods' scripts' probe of a path: "ok" if a byte can be written there, else the errno's
#: name.
TRY_WRITE = """
import errno
def try_write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        return "ok"
    except OSError as err:
        return errno.errorcode[err.errno]
"""

READ_VOLUMES = (
    TRY_WRITE
    + """
import json, os, stat
def read(path):
    with open(path) as f:
        return f.read()
out = {
    "password": read("/etc/creds/password"),
    "password_mode": oct(stat.S_IMODE(os.stat("/etc/creds/password").st_mode)),
    "creds": sorted(os.listdir("/etc/creds")),
    "config_item": read("/etc/cfg/conf/config.yaml"),
    "cfg": sorted(os.listdir("/etc/cfg")),
    "subpath": read("/etc/app/config.yaml"),
    "app_dir": sorted(os.listdir("/etc/app")),
    "from_init": read("/scratch/from-init"),
    "labels": read("/etc/podinfo/labels"),
    "podname": read("/etc/podinfo/name"),
    "write_secret": try_write("/etc/creds/new"),
    "write_config": try_write("/etc/cfg/new"),
    "write_ro_emptydir": try_write("/data/ro/new"),
    "write_scratch": try_write("/scratch/from-main"),
    "etc_hosts_has_me": os.environ["HOSTNAME_CHECK"] in read("/etc/hosts"),
}
print(json.dumps(out), flush=True)
"""
)

PVC_STEP = """
import json, os, sys
step = int(sys.argv[1])
found = {f: open(f"/checkpoints/{f}").read() for f in sorted(os.listdir("/checkpoints"))}
with open(f"/checkpoints/step-{step}", "w") as f:
    f.write(os.environ["POD_NAME"])
print(json.dumps({"found": found}), flush=True)
"""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_secret_configmap_emptydir_downward_api_and_subpath(cluster, sa_api, admin_api) -> None:
    admin, core = client.CoreV1Api(admin_api), client.CoreV1Api(sa_api)
    ns, name = cluster.namespace, _name("volumes")
    secret, config_map = _name("creds"), _name("cfg")
    admin.create_namespaced_secret(
        ns, {"metadata": {"name": secret}, "stringData": {"password": "s3cret", "user": "bob"}}
    )
    admin.create_namespaced_config_map(
        ns, {"metadata": {"name": config_map}, "data": {"config.yaml": "a: 1\n", "other": "x"}}
    )
    pod = python_pod(
        name,
        READ_VOLUMES,
        env=[{"name": "HOSTNAME_CHECK", "value": name}],
        volume_mounts=[
            {"name": "creds", "mountPath": "/etc/creds"},
            {"name": "cfg", "mountPath": "/etc/cfg"},
            {"name": "whole-cfg", "mountPath": "/etc/app/config.yaml", "subPath": "config.yaml"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "scratch", "mountPath": "/data/ro", "readOnly": True},
            {"name": "podinfo", "mountPath": "/etc/podinfo"},
        ],
        volumes=[
            {"name": "creds", "secret": {"secretName": secret, "defaultMode": 0o400}},
            {
                "name": "cfg",
                "configMap": {
                    "name": config_map,
                    "items": [{"key": "config.yaml", "path": "conf/config.yaml"}],
                },
            },
            {"name": "whole-cfg", "configMap": {"name": config_map}},
            {"name": "scratch", "emptyDir": {}},
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    ]
                },
            },
        ],
        initContainers=[
            {
                "name": "init",
                "image": "local/python",
                "command": [
                    sys.executable,
                    "-c",
                    "open('/scratch/from-init', 'w').write('hello from init')",
                ],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }
        ],
    )
    core.create_namespaced_pod(ns, pod)
    done = wait_terminal(core, ns, name)
    log = container_log(cluster.workdir, done)
    assert done.status.phase == "Succeeded", log
    assert done.status.init_container_statuses[0].state.terminated.reason == "Completed"
    out = last_json_line(log)
    assert out == {
        "password": "s3cret",
        "password_mode": "0o400",
        "creds": ["password", "user"],
        "config_item": "a: 1\n",
        "cfg": ["conf"],
        "subpath": "a: 1\n",
        "app_dir": ["config.yaml"],
        "from_init": "hello from init",
        "labels": "\n".join(f'{k}="{v}"' for k, v in sorted(TEST_POD_LABELS.items())),
        "podname": name,
        "write_secret": "EROFS",
        "write_config": "EROFS",
        "write_ro_emptydir": "EROFS",
        "write_scratch": "ok",
        "etc_hosts_has_me": True,
    }
    # The emptyDir is a directory of the pod on the host; nothing was created in the host's /etc.
    pod_dir = cluster.workdir / "pods" / f"{ns}_{name}_{done.metadata.uid[:8]}"
    scratch = pod_dir / "volumes" / "scratch"
    assert sorted(p.name for p in scratch.iterdir()) == ["from-init", "from-main"]
    for path in ("/etc/creds", "/etc/cfg", "/etc/app", "/etc/podinfo", "/scratch", "/data/ro"):
        assert not Path(path).exists(), path
    admin.delete_namespaced_secret(secret, ns)
    admin.delete_namespaced_config_map(config_map, ns)


def test_persistent_volume_claim_is_shared_by_pods_in_sequence(cluster, sa_api, admin_api) -> None:
    admin, core = client.CoreV1Api(admin_api), client.CoreV1Api(sa_api)
    ns, claim = cluster.namespace, _name("ckpt")
    pvc = bound_claim(admin, ns, claim, "ReadWriteOnce")
    assert pvc.spec.storage_class_name == "process-local"  # the default StorageClass
    volume = pvc.spec.volume_name

    outputs = []
    for step in (1, 2):
        name = _name(f"step-{step}")
        pod = python_pod(
            name,
            PVC_STEP,
            env=[{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            volume_mounts=[{"name": "ckpt", "mountPath": "/checkpoints"}],
            volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": claim}}],
        )
        pod["spec"]["containers"][0]["args"] = [str(step)]
        core.create_namespaced_pod(ns, pod)
        done = wait_terminal(core, ns, name)
        log = container_log(cluster.workdir, done)
        assert done.status.phase == "Succeeded", log
        outputs.append((name, last_json_line(log)["found"]))

    (first, seen_first), (_, seen_second) = outputs
    assert seen_first == {}
    assert seen_second == {"step-1": first}  # the second pod sees what the first wrote
    host_dir = cluster.pvc_root / ns / claim
    assert sorted(p.name for p in host_dir.iterdir()) == ["step-1", "step-2"]

    # Deleting the claim releases the volume; the provisioner deletes it and its data.
    for pod in core.list_namespaced_pod(ns).items:
        core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
    admin.delete_namespaced_persistent_volume_claim(claim, ns)

    def volume_gone() -> bool:
        try:
            admin.read_persistent_volume(volume)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for("the released volume to be deleted", volume_gone, timeout=60)
    assert not host_dir.exists()


def test_pod_waits_for_a_missing_secret_then_starts(cluster, sa_api, admin_api) -> None:
    admin, core = client.CoreV1Api(admin_api), client.CoreV1Api(sa_api)
    ns, name, secret = cluster.namespace, _name("waits"), _name("late")
    pod = python_pod(
        name,
        "print(open('/etc/late/key').read(), flush=True)",
        volume_mounts=[{"name": "late", "mountPath": "/etc/late"}],
        volumes=[{"name": "late", "secret": {"secretName": secret}}],
    )
    core.create_namespaced_pod(ns, pod)

    def creating() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, ns)
        statuses = pod.status.container_statuses or []
        waiting = statuses and statuses[0].state.waiting
        return pod if waiting and waiting.reason == "ContainerCreating" else None

    pending = wait_for("the pod to wait for its Secret", creating, timeout=30)
    assert pending.status.phase == "Pending" and pending.status.pod_ip
    admin.create_namespaced_secret(ns, {"metadata": {"name": secret}, "stringData": {"key": "v"}})
    done = wait_terminal(core, ns, name, timeout=60)
    assert done.status.phase == "Succeeded"
    assert container_log(cluster.workdir, done).strip() == "v"
    admin.delete_namespaced_secret(secret, ns)


READ_ONLY_ROOT = (
    TRY_WRITE
    + """
import json, os, tempfile
with open("/dev/null", "w") as f:
    f.write("x")
print(json.dumps({
    "root": try_write("/written-at-root"),
    "etc": try_write("/etc/written"),
    "home": try_write(os.path.expanduser("~") + "/written"),
    "tmp": try_write("/tmp/written"),
    "tempfile": bool(tempfile.mkstemp()),
    "scratch": try_write("/scratch/written"),
}), flush=True)
"""
)


def test_a_read_only_root_leaves_only_the_volumes_writable(cluster, sa_api) -> None:
    """securityContext.readOnlyRootFilesystem, as a runtime applies it: the image is
    read-only, its volumes (here emptyDirs on /tmp and /scratch) and /dev are not."""
    core, ns, name = client.CoreV1Api(sa_api), cluster.namespace, _name("ro-root")
    pod = python_pod(
        name,
        READ_ONLY_ROOT,
        volume_mounts=[
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
        volumes=[{"name": "tmp", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}],
    )
    pod["spec"]["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": True}
    core.create_namespaced_pod(ns, pod)
    done = wait_terminal(core, ns, name)
    log = container_log(cluster.workdir, done)
    assert done.status.phase == "Succeeded", log
    assert last_json_line(log) == {
        "root": "EROFS",
        "etc": "EROFS",
        "home": "EROFS",
        "tmp": "ok",
        "tempfile": True,
        "scratch": "ok",
    }
    # Without the volume on /tmp, /tmp is the image's, and read-only too.
    name = _name("ro-tmp")
    pod = python_pod(name, "open('/tmp/x', 'w')")
    pod["spec"]["containers"][0]["securityContext"] = {"readOnlyRootFilesystem": True}
    core.create_namespaced_pod(ns, pod)
    done = wait_terminal(core, ns, name)
    assert done.status.phase == "Failed"
    assert "Read-only file system" in container_log(cluster.workdir, done)
