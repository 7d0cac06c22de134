"""The manifests of the Kubernetes backend, built without a cluster: pods (restricted Pod
Security, labels, env, secrets by reference, resources, priority, placement, the pod template),
the Secret, the master Service, the owner, and --dry-run's output."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections import Counter

import pytest
import yaml

from elastic_step.backends.api import BackendError, LaunchSpec, Resources, Role
from elastic_step.backends.kubernetes_options import (
    KubernetesOptions,
    RoleResources,
    Toleration,
    Volume,
)
from elastic_step.backends.kubernetes_pods import (
    build_master_endpoints,
    build_master_service,
    build_owner,
    build_pod,
    build_secret,
    high_priority_slot,
    high_priority_slots,
    merge,
    owner_reference,
)

OWNER = owner_reference("argoproj.io/v1alpha1", "Workflow", "run-1", "uid-1")


def launch(name="worker-3", role=Role.WORKER, index=3, **kw) -> LaunchSpec:
    return LaunchSpec(name, role, index, ["python", "-m", "elastic_step", "worker"], **kw)


def pod(spec=None, options=None, **kw) -> dict:
    return build_pod(
        spec or launch(),
        options or KubernetesOptions(),
        job_name=kw.get("job_name", "job-1"),
        namespace="ml",
        image="reg/es:1",
        owner=kw.get("owner", OWNER),
    )


def main_container(p: dict) -> dict:
    return next(c for c in p["spec"]["containers"] if c["name"] == "main")


def env_of(p: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main_container(p)["env"]}


def test_name_labels_owner_and_restart_policy() -> None:
    p = pod(launch("ps-0-2", Role.PS, 0))
    assert p["metadata"]["name"] == "job-1-ps-0-2"
    assert p["metadata"]["namespace"] == "ml"
    assert p["metadata"]["labels"] == {
        "elastic-step/job": "job-1",
        "elastic-step/role": "ps",
        "elastic-step/index": "0",
        "elastic-step/instance": "ps-0-2",
        "app.kubernetes.io/managed-by": "elastic-step",
    }
    assert p["metadata"]["ownerReferences"] == [OWNER]
    assert "controller" not in OWNER and "blockOwnerDeletion" not in OWNER
    assert p["spec"]["restartPolicy"] == "Never"
    assert main_container(p)["command"] == ["python", "-m", "elastic_step", "worker"]
    assert main_container(p)["image"] == "reg/es:1"


def test_every_pod_meets_the_restricted_pod_security_standard() -> None:
    for p in (pod(), pod(launch("ps-0", Role.PS, 0))):
        spec = p["spec"]
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        assert main_container(p)["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        }
        # The one writable place besides the volumes: an emptyDir on /tmp, HOME there.
        assert spec["volumes"] == [{"name": "tmp", "emptyDir": {}}]
        assert main_container(p)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
        assert env_of(p)["HOME"] == "/tmp"
        assert spec["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in spec
        assert p["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}


def test_the_environment_refers_to_the_secret_and_never_holds_its_value() -> None:
    p = pod(launch(env={"PLAIN": "x"}, secret_env={"ELASTIC_STEP_TOKEN": "hunter2"}))
    assert "hunter2" not in json.dumps(p)
    env = env_of(p)
    # Keyed by the value, so what a role's instances share is kept once.
    key = "ELASTIC_STEP_TOKEN." + hashlib.sha256(b"hunter2").hexdigest()[:20]
    assert env["ELASTIC_STEP_TOKEN"] == {"secretKeyRef": {"name": "job-1-secret", "key": key}}
    assert env["ELASTIC_STEP_INSTANCE"] == "worker-3"
    assert env["ELASTIC_STEP_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["ELASTIC_STEP_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["PLAIN"] == "x"
    assert "ELASTIC_STEP_CPU_LIMIT" not in env  # no CPU limit, no thread sizing


def test_resources_per_role_and_the_cpu_limit_for_tensorflow() -> None:
    options = KubernetesOptions(
        worker=RoleResources(cpu="2", memory="4Gi", gpu=1), ps=RoleResources(memory="8Gi")
    )
    worker = main_container(pod(options=options))
    assert worker["resources"] == {
        "limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1},
        "requests": {"cpu": "2", "memory": "4Gi"},
    }
    assert env_of(pod(options=options))["ELASTIC_STEP_CPU_LIMIT"] == {
        "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu", "divisor": "1"}
    }
    ps = pod(launch("ps-0", Role.PS, 0), options)
    assert main_container(ps)["resources"] == {
        "limits": {"memory": "8Gi"},
        "requests": {"memory": "8Gi"},
    }
    assert "ELASTIC_STEP_CPU_LIMIT" not in env_of(ps)
    # The launch spec's own resources come first.
    spec = launch(resources=Resources(cpu="500m", priority_class="urgent"))
    p = pod(spec, options)
    assert main_container(p)["resources"]["limits"]["cpu"] == "500m"
    assert p["spec"]["priorityClassName"] == "urgent"


def test_ps_pods_prefer_other_nodes_than_the_jobs_other_ps() -> None:
    affinity = pod(launch("ps-1", Role.PS, 1))["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {
        "labelSelector": {"matchLabels": {"elastic-step/job": "job-1", "elastic-step/role": "ps"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    assert "affinity" not in pod()["spec"]


@pytest.mark.parametrize(
    ("fraction", "slots", "high"),
    [
        (0.25, 8, [0, 5]),
        (0.5, 5, [0, 2, 4]),
        (0.34, 3, [0]),
        (0.1, 3, [0]),
        (1.0, 3, [0, 1, 2]),
        (0.0, 3, []),
    ],
)
def test_high_priority_slots(fraction, slots, high) -> None:
    assert [s for s in range(slots) if high_priority_slot(s, fraction)] == high
    for n in range(1, 40):
        count = sum(high_priority_slot(s, fraction) for s in range(n))
        assert count == high_priority_slots(n, fraction)
        assert fraction == 0 or count >= 1  # preemption never takes every worker


def test_priority_classes() -> None:
    options = KubernetesOptions(
        worker_priority_class="low", high_priority_class="high", high_priority_fraction=0.5
    )
    classes = [
        pod(launch(f"worker-{s}", index=s), options)["spec"]["priorityClassName"] for s in range(4)
    ]
    assert classes == ["high", "low", "high", "low"]
    assert pod(launch("ps-0", Role.PS, 0), options)["spec"]["priorityClassName"] == "high"
    just_low = KubernetesOptions(worker_priority_class="low")
    assert pod(launch("ps-0", Role.PS, 0), just_low)["spec"]["priorityClassName"] == "low"
    assert "priorityClassName" not in pod()["spec"]


def test_placement_volumes_and_pulls() -> None:
    options = KubernetesOptions(
        node_selector={"pool": "train"},
        tolerations=(Toleration(key="gpu", effect="NoSchedule"),),
        volumes=(Volume(claim="data", mount="/data", read_only=True, sub_path="d"),),
        image_pull_policy="IfNotPresent",
        image_pull_secrets=("registry",),
        service_account="runner",
    )
    p = pod(options=options)
    spec, main = p["spec"], main_container(p)
    assert spec["nodeSelector"] == {"pool": "train"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "volume-0", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
    ]
    assert main["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "volume-0", "mountPath": "/data", "readOnly": True, "subPath": "d"},
    ]
    assert main["imagePullPolicy"] == "IfNotPresent"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == "runner"
    assert spec["automountServiceAccountToken"] is False


def test_the_pod_template_sits_between_the_defaults_and_the_flags() -> None:
    template = {
        "metadata": {
            "labels": {"team": "ml", "elastic-step/job": "hijack"},
            "annotations": {"sidecar.istio.io/inject": "true", "x": "y"},
        },
        "spec": {
            "automountServiceAccountToken": True,
            "nodeSelector": {"pool": "template", "zone": "a"},
            "tolerations": [{"key": "t", "operator": "Exists"}],
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "command": ["not", "this"],
                    "args": ["nor", "this"],
                    "env": [
                        {"name": "ELASTIC_STEP_INSTANCE", "value": "no"},
                        {"name": "T", "value": "1"},
                    ],
                    "resources": {"limits": {"cpu": "1"}},
                },
                {"name": "log-shipper", "image": "busybox"},
            ],
        },
    }
    options = KubernetesOptions(
        pod_template=template,
        node_selector={"pool": "flag"},
        tolerations=(Toleration(key="f", effect="NoSchedule"),),
        env={"T": "2"},
    )
    p = pod(options=options)
    # The template changes the defaults...
    assert p["metadata"]["annotations"] == {"sidecar.istio.io/inject": "true", "x": "y"}
    assert p["spec"]["automountServiceAccountToken"] is True
    # ...the flags change the template...
    assert p["spec"]["nodeSelector"] == {"pool": "flag", "zone": "a"}
    assert [t["key"] for t in p["spec"]["tolerations"]] == ["t", "f"]
    env = env_of(p)
    assert env["T"] == "2"
    # ...and nothing changes what elastic-step needs.
    assert p["metadata"]["labels"]["elastic-step/job"] == "job-1"
    assert p["metadata"]["labels"]["team"] == "ml"
    main = main_container(p)
    assert main["command"] == ["python", "-m", "elastic_step", "worker"] and "args" not in main
    assert env["ELASTIC_STEP_INSTANCE"] == "worker-3"
    assert [c["name"] for c in p["spec"]["containers"]] == ["main", "log-shipper"]
    # A CPU limit from the template also sizes TensorFlow's threads.
    assert "ELASTIC_STEP_CPU_LIMIT" in env
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_merge() -> None:
    base = {"a": {"b": 1, "c": 2}, "l": [1, 2], "n": [{"name": "x", "v": 1}], "u": [{"k": 1}]}
    overlay = {"a": {"c": None, "d": 4}, "l": [3], "n": [{"name": "x", "w": 2}, {"name": "y"}],
               "u": [{"k": 1}, {"k": 2}]}  # fmt: skip
    assert merge(base, overlay) == {
        "a": {"b": 1, "d": 4},
        "l": [3],
        "n": [{"name": "x", "v": 1, "w": 2}, {"name": "y"}],
        "u": [{"k": 1}, {"k": 2}],
    }
    assert base["a"] == {"b": 1, "c": 2}  # unchanged


def test_a_name_no_pod_can_carry_is_refused() -> None:
    with pytest.raises(BackendError, match="not a DNS-1123 label"):
        pod(launch("Worker_3"))
    with pytest.raises(BackendError, match="not a DNS-1123 label"):
        pod(job_name="j" * 60)
    with pytest.raises(BackendError, match="cannot be a Secret key"):
        pod(launch(secret_env={"a b": "x"}))


def test_the_secret_the_service_and_the_owner() -> None:
    secret = build_secret("job-1", "ml", {"K": "v@lue"}, OWNER)
    assert secret["metadata"]["name"] == "job-1-secret"
    assert base64.b64decode(secret["data"]["K"]) == b"v@lue"
    assert secret["metadata"]["ownerReferences"] == [OWNER]
    service = build_master_service("job-1", "ml", 5000, OWNER)
    assert service["metadata"]["name"] == "job-1-master"
    assert service["spec"]["clusterIP"] == "None"
    assert "selector" not in service["spec"]  # the master writes its own address
    assert service["spec"]["ports"][0]["port"] == 5000
    endpoints = build_master_endpoints("job-1", "ml", "10.0.0.7", 5000, OWNER)
    assert endpoints["metadata"]["name"] == "job-1-master"
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "job-1-master"
    assert endpoints["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "elastic-step"
    assert endpoints["addressType"] == "IPv4"
    assert endpoints["endpoints"] == [{"addresses": ["10.0.0.7"], "conditions": {"ready": True}}]
    assert endpoints["ports"] == [{"name": "grpc", "port": 5000, "protocol": "TCP"}]
    assert build_master_endpoints("job-1", "ml", "fd00::7", 1, None)["addressType"] == "IPv6"
    owner = build_owner("job-1", "ml")
    assert (owner["kind"], owner["metadata"]["name"]) == ("ConfigMap", "job-1-owner")
    assert "ownerReferences" not in owner["metadata"]


def test_dry_run_prints_every_object_of_the_start_without_a_cluster(monkeypatch) -> None:
    from elastic_step.master.config import TrainConfig
    from elastic_step.training import dry_run

    # No cluster: any attempt to load a configuration would fail the test.
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    config = TrainConfig(
        model_def="m.py", data="d", output="o", workers=2, ps=2, job_name="job-1", port=6000,
        backend="kubernetes",
    )  # fmt: skip
    out = io.StringIO()
    assert dry_run(config, KubernetesOptions(image="reg/es:1", namespace="ml"), out) == 0
    objects = list(yaml.safe_load_all(out.getvalue()))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "job-1-owner"),
        ("Secret", "job-1-secret"),
        ("Service", "job-1-master"),
        ("Pod", "job-1-ps-0"),
        ("Pod", "job-1-ps-1"),
        ("Pod", "job-1-worker-0"),
        ("Pod", "job-1-worker-1"),
    ]
    placeholder = "<generated when the job starts>"
    keys = objects[1]["stringData"]
    assert set(keys.values()) == {placeholder}
    # A token per instance; the verify key, and the CA's certificate, once; a certificate
    # and key per role (TLS is on with pods).
    assert Counter(key.split(".")[0] for key in keys) == {
        "ELASTIC_STEP_TOKEN": 4,
        "ELASTIC_STEP_VERIFY_KEY": 1,
        "ELASTIC_STEP_TLS_CA": 1,
        "ELASTIC_STEP_TLS_CERT": 2,
        "ELASTIC_STEP_TLS_KEY": 2,
    }
    for instance in objects[3:]:
        refs = [e["valueFrom"]["secretKeyRef"]["key"] for e in main_container(instance)["env"]
                if "secretKeyRef" in e.get("valueFrom", {})]  # fmt: skip
        assert len(refs) == 5 and set(refs) <= set(keys)
    worker = objects[6]
    assert main_container(worker)["command"][-4:] == [
        "--master",
        "job-1-master.ml.svc:6000",
        "--name",
        "worker-1",
    ]
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "job-1-owner"}
    for obj in objects[1:]:
        assert {k: obj["metadata"]["ownerReferences"][0][k] for k in owner} == owner


def test_dry_run_loads_no_kubernetes_client() -> None:
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys\n"
        "from elastic_step.cli import main\n"
        "argv = ['train', '--model-def', 'm.py', '--data', 'd', '--output', 'o', '--backend',\n"
        "        'kubernetes', '--dry-run', '--image', 'x']\n"
        "assert main(argv) == 0\n"
        "assert 'kubernetes' not in sys.modules, 'the dry run imported the kubernetes client'\n"
    )
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    assert "kind: Pod" in result.stdout
