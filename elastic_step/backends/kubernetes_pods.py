"""The manifests of a job's objects on Kubernetes, as plain JSON-style dicts.

Pure functions, no API calls: the backend creates what they build, and ``--dry-run`` prints
the same objects. Names and labels:

- pod ``<job>-<instance>`` (``job-1-worker-3``, ``job-1-ps-0-2``); labels
  ``elastic-step/job``, ``elastic-step/role``, ``elastic-step/index``,
  ``elastic-step/instance`` and ``app.kubernetes.io/managed-by: elastic-step``;
- the job's Secret ``<job>-secret``: the values of each instance's ``LaunchSpec.secret_env``,
  under the keys ``<VARIABLE>.<hash of the value>`` (see :func:`secret_key`);
- the headless Service ``<job>-master`` and its EndpointSlice, which holds the current
  master's pod IP (the master writes it: no pod is patched);
- the owner ConfigMap ``<job>-owner``, when nothing else owns the job (see
  kubernetes_job_objects.py).

A pod is built in layers, each over the one before: the backend's defaults (the
``restricted`` Pod Security Standard, ``sidecar.istio.io/inject: "false"``, no ServiceAccount
token, PS anti-affinity), then ``--pod-template``, then the flags (image, resources, node
selector, tolerations, priority, volumes, env), then what elastic-step itself needs (name,
labels, owner, ``restartPolicy: Never``, the container's command and its ELASTIC_STEP_*
env), which nothing overrides. Merging is strategic-merge-like: mappings merge key by key, a
null deletes a key, lists of named items (containers, env, volumes...) merge by name, other
lists of mappings are concatenated and lists of scalars replaced.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_step.backends.api import BackendError, LaunchSpec, Role
from elastic_step.backends.kubernetes_options import KubernetesOptions

MANAGED_BY = "elastic-step"
LABEL_JOB = "elastic-step/job"
LABEL_ROLE = "elastic-step/role"
LABEL_INDEX = "elastic-step/index"
LABEL_INSTANCE = "elastic-step/instance"
#: On a pod that runs a master, set when the pod is made (the Argo templates set it; with
#: KFP, ``kubernetes.add_pod_label``): what manifests/network-policy.yaml admits to the PS.
LABEL_MASTER = "elastic-step/master"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
#: The name of the container that runs the worker or PS.
CONTAINER = "main"
#: The emptyDir on /tmp, the one writable place of a worker or PS pod besides its volumes.
TMP_VOLUME = "tmp"
ISTIO_INJECT = "sidecar.istio.io/inject"
SECRET_PLACEHOLDER = "<generated when the job starts>"
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
#: Kubeflow Pipelines' Secret for its MinIO artifact store.
KFP_MINIO_SECRET = "mlpipeline-minio-artifact"


def pod_name(job_name: str, instance: str) -> str:
    return f"{job_name}-{instance}"


def service_name(job_name: str) -> str:
    return f"{job_name}-master"


def secret_name(job_name: str) -> str:
    return f"{job_name}-secret"


def owner_name(job_name: str) -> str:
    return f"{job_name}-owner"


def secret_key(variable: str, value: str) -> str:
    """The key of the job's Secret that holds ``value`` of ``variable``. Named by the value:
    what every instance of a role shares (its certificate) is kept once, and what differs
    (each instance's token) once per instance, so the Secret stays far below its 1 MiB
    limit with a thousand workers."""
    return f"{variable}.{hashlib.sha256(value.encode()).hexdigest()[:20]}"


def storage_secret_env(secret: str) -> list[dict[str, Any]]:
    """The env entries that give a pod the object store's credentials from Secret ``secret``
    (``--storage-secret``), under the variables object_storage.py reads.

    KFP's ``mlpipeline-minio-artifact`` holds them under ``accesskey`` and ``secretkey``
    (minio:// then finds KFP's MinIO by its default endpoint). Any other Secret holds them
    under the variables' own names; AWS_SESSION_TOKEN, AWS_ENDPOINT_URL and AWS_REGION may
    be absent. A missing required key keeps the pod from starting, and its event names it.
    """
    if secret == KFP_MINIO_SECRET:
        keys = {"AWS_ACCESS_KEY_ID": "accesskey", "AWS_SECRET_ACCESS_KEY": "secretkey"}
        optional: tuple[str, ...] = ()
    else:
        optional = ("AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION")
        keys = {v: v for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", *optional)}
    return [
        {
            "name": variable,
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret,
                    "key": key,
                    **({"optional": True} if variable in optional else {}),
                }
            },
        }
        for variable, key in keys.items()
    ]


def job_selector(job_name: str) -> str:
    """The label selector of every object of the job."""
    return f"{LABEL_JOB}={job_name},{LABEL_MANAGED_BY}={MANAGED_BY}"


def job_labels(job_name: str) -> dict[str, str]:
    return {LABEL_JOB: job_name, LABEL_MANAGED_BY: MANAGED_BY}


def instance_labels(job_name: str, role: Role, index: int, instance: str) -> dict[str, str]:
    return {
        **job_labels(job_name),
        LABEL_ROLE: role.value,
        LABEL_INDEX: str(index),
        LABEL_INSTANCE: instance,
    }


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """A reference to the run's object. Not a controller reference (the owner's controller,
    Argo or the Job controller, must not take the pods for its own), and it does not block the
    owner's deletion (that would need update on the owner's finalizers)."""
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


def _metadata(
    name: str, namespace: str | None, labels: dict[str, str], owner: Mapping | None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = labels
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    return metadata


# -- merging --


def merge(base: Any, overlay: Any) -> Any:
    """``overlay`` over ``base``, strategic-merge-like (see the module docstring). Neither
    argument is changed."""
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        merged = {k: copy.deepcopy(v) for k, v in base.items()}
        for key, value in overlay.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(overlay, list):
        if _named(base) and _named(overlay):
            merged_list = [copy.deepcopy(item) for item in base]
            positions = {item["name"]: i for i, item in enumerate(merged_list)}
            for item in overlay:
                if item["name"] in positions:
                    i = positions[item["name"]]
                    merged_list[i] = merge(merged_list[i], item)
                else:
                    positions[item["name"]] = len(merged_list)
                    merged_list.append(copy.deepcopy(item))
            return merged_list
        if all(isinstance(item, Mapping) for item in base + overlay):
            merged_list = [copy.deepcopy(item) for item in base]
            merged_list += [copy.deepcopy(i) for i in overlay if i not in merged_list]
            return merged_list
    return copy.deepcopy(overlay)


def _named(items: list) -> bool:
    return all(isinstance(item, Mapping) and isinstance(item.get("name"), str) for item in items)


# -- pods --


def high_priority_slots(slots: int, fraction: float) -> int:
    """How many of worker slots 0..slots-1 get the high PriorityClass: ``fraction`` of them,
    rounded, and at least one when ``fraction`` > 0 (so preemption never takes them all)."""
    if fraction <= 0 or slots <= 0:
        return 0
    return max(1, math.floor(slots * fraction + 0.5 + 1e-9))


def high_priority_slot(slot: int, fraction: float) -> bool:
    """Whether worker ``slot`` gets the high class: the slots where
    :func:`high_priority_slots` grows, so slot 0 always does when ``fraction`` > 0, and the
    first n slots always hold that many high ones, however far the job grows."""
    return high_priority_slots(slot + 1, fraction) > high_priority_slots(slot, fraction)


def priority_class(options: KubernetesOptions, role: Role, slot: int) -> str | None:
    """PS pods get the high class if any (a preempted PS stalls every worker); workers get it
    for ``--high-priority-fraction`` of their slots, and ``--worker-priority-class`` otherwise."""
    if options.high_priority_class is not None and (
        role is Role.PS or high_priority_slot(slot, options.high_priority_fraction)
    ):
        return options.high_priority_class
    return options.worker_priority_class


def _defaults(job_name: str, role: Role) -> dict[str, Any]:
    """The backend's defaults, under the pod template."""
    spec: dict[str, Any] = {
        # Workers and PS never call the API: no token that a compromised one could use.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": CONTAINER,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    # Nothing writes into the image: the user's code cannot change what
                    # the next process of the pod runs.
                    "readOnlyRootFilesystem": True,
                },
                # What TensorFlow, Keras and the user's code write goes to /tmp, which is the
                # pod's own; HOME too (Keras's cache).
                "env": [{"name": "HOME", "value": "/tmp"}],
                "volumeMounts": [{"name": TMP_VOLUME, "mountPath": "/tmp"}],
            }
        ],
        "volumes": [{"name": TMP_VOLUME, "emptyDir": {}}],
    }
    if role is Role.PS:
        # Spread the shards over nodes, so that one node's network does not carry them all.
        spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {
                                "matchLabels": {LABEL_JOB: job_name, LABEL_ROLE: Role.PS.value}
                            },
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        }
    return {"metadata": {"annotations": {ISTIO_INJECT: "false"}}, "spec": spec}


def _from_flags(spec: LaunchSpec, options: KubernetesOptions, image: str) -> dict[str, Any]:
    """What the flags and the launch spec's resources set."""
    role_resources = options.resources_for(spec.role.value)
    cpu = spec.resources.cpu or role_resources.cpu
    memory = spec.resources.memory or role_resources.memory
    gpu = spec.resources.gpu or role_resources.gpu
    quantities: dict[str, Any] = {}
    if cpu:
        quantities["cpu"] = cpu
    if memory:
        quantities["memory"] = memory
    container: dict[str, Any] = {"name": CONTAINER, "image": image}
    if options.image_pull_policy:
        container["imagePullPolicy"] = options.image_pull_policy
    if quantities or gpu:
        limits = {**quantities, **({"nvidia.com/gpu": gpu} if gpu else {})}
        container["resources"] = {"limits": limits}
        if quantities:
            container["resources"]["requests"] = dict(quantities)
    env = {**options.env, **spec.env}
    env_entries = [{"name": k, "value": v} for k, v in env.items()]
    if options.storage_secret:
        # A variable that --env sets (an endpoint, say) is not taken from the Secret.
        secret_entries = storage_secret_env(options.storage_secret)
        env_entries += [e for e in secret_entries if e["name"] not in env]
    if env_entries:
        container["env"] = env_entries
    if options.volumes:
        container["volumeMounts"] = [
            {
                "name": f"volume-{i}",
                "mountPath": v.mount,
                **({"readOnly": True} if v.read_only else {}),
                **({"subPath": v.sub_path} if v.sub_path else {}),
            }
            for i, v in enumerate(options.volumes)
        ]
    pod_spec: dict[str, Any] = {"containers": [container]}
    priority = spec.resources.priority_class or priority_class(options, spec.role, spec.index)
    if priority:
        pod_spec["priorityClassName"] = priority
    if options.service_account:
        pod_spec["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in options.image_pull_secrets]
    if options.node_selector:
        pod_spec["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod_spec["tolerations"] = [t.manifest() for t in options.tolerations]
    if options.volumes:
        pod_spec["volumes"] = [
            {
                "name": f"volume-{i}",
                "persistentVolumeClaim": {
                    "claimName": v.claim,
                    **({"readOnly": True} if v.read_only else {}),
                },
            }
            for i, v in enumerate(options.volumes)
        ]
    return {"spec": pod_spec}


def build_pod(
    spec: LaunchSpec,
    options: KubernetesOptions,
    *,
    job_name: str,
    namespace: str | None,
    image: str,
    owner: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The pod of one instance. Raises BackendError for a spec no pod can carry."""
    name = pod_name(job_name, spec.name)
    if len(name) > 63 or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        raise BackendError(f"instance {spec.name}: pod name {name!r} is not a DNS-1123 label")
    for key in spec.secret_env:
        if not _SECRET_KEY.fullmatch(key):
            raise BackendError(f"instance {spec.name}: secret env {key!r} cannot be a Secret key")
    pod = merge(_defaults(job_name, spec.role), options.pod_template or {})
    pod = merge(pod, _from_flags(spec, options, image))
    # What elastic-step needs, over everything else.
    merged_metadata = pod.get("metadata") or {}
    labels = {**(merged_metadata.get("labels") or {})}
    labels.update(instance_labels(job_name, spec.role, spec.index, spec.name))
    metadata = _metadata(name, namespace, labels, None)
    metadata.update({k: v for k, v in merged_metadata.items() if k not in metadata})
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    pod_spec = pod["spec"]
    pod_spec["restartPolicy"] = "Never"
    main = next(c for c in pod_spec["containers"] if c["name"] == CONTAINER)
    main["command"] = list(spec.command)
    main.pop("args", None)
    limits = (main.get("resources") or {}).get("limits") or {}
    own_env: list[dict[str, Any]] = [
        {"name": "ELASTIC_STEP_INSTANCE", "value": spec.name},
        _field_env("ELASTIC_STEP_POD_NAME", "metadata.name"),
        # The PS listens on, and advertises, its pod's IP.
        _field_env("ELASTIC_STEP_HOST", "status.podIP"),
    ]
    if "cpu" in limits:
        # TensorFlow sizes its thread pools from this, not from the node's cores.
        own_env.append(
            {
                "name": "ELASTIC_STEP_CPU_LIMIT",
                "valueFrom": {
                    "resourceFieldRef": {
                        "containerName": CONTAINER,
                        "resource": "limits.cpu",
                        "divisor": "1",
                    }
                },
            }
        )
    own_env += [
        {
            "name": variable,
            "valueFrom": {
                "secretKeyRef": {
                    "name": secret_name(job_name),
                    "key": secret_key(variable, value),
                }
            },
        }
        for variable, value in spec.secret_env.items()
    ]
    own_names = {e["name"] for e in own_env}
    main["env"] = own_env + [e for e in main.get("env") or [] if e["name"] not in own_names]
    # The order a reader of --dry-run expects; the API does not care.
    first = ("name", "image", "imagePullPolicy", "command", "env", "resources", "volumeMounts")
    ordered = {k: main[k] for k in first if k in main}
    main_index = pod_spec["containers"].index(main)
    pod_spec["containers"][main_index] = {**ordered, **main}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# -- the job's other objects --


def build_secret(
    job_name: str,
    namespace: str | None,
    values: Mapping[str, str],
    owner: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The job's Secret: ``values`` by key (see :func:`secret_key`)."""
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(secret_name(job_name), namespace, job_labels(job_name), owner),
        "type": "Opaque",
    }
    secret["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    return secret


def placeholder_secret(
    job_name: str, namespace: str | None, keys: Sequence[str], owner: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The job's Secret as --dry-run shows it: the real value is made when the job starts."""
    secret = build_secret(job_name, namespace, {}, owner)
    del secret["data"]
    secret["stringData"] = dict.fromkeys(keys, SECRET_PLACEHOLDER)
    return secret


def build_master_service(
    job_name: str, namespace: str | None, port: int, owner: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A headless Service whose name resolves to the current master pod's IP: it selects no
    pod; the master writes its own address into the EndpointSlice of the same name
    (:func:`build_master_endpoints`), so no pod is ever patched."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(service_name(job_name), namespace, job_labels(job_name), owner),
        "spec": {
            "clusterIP": "None",
            "ports": [{"name": "grpc", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


#: The label that ties an EndpointSlice to its Service, and the one that tells the
#: EndpointSlice controller that someone else manages it.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
SLICE_MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"


def build_master_endpoints(
    job_name: str,
    namespace: str | None,
    address: str,
    port: int,
    owner: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The EndpointSlice of the master's Service: the current master's ``address`` (its
    pod's IP) on ``port``."""
    name = service_name(job_name)
    labels = {
        **job_labels(job_name),
        SERVICE_NAME_LABEL: name,
        SLICE_MANAGED_BY_LABEL: f"{MANAGED_BY}.io",
    }
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _metadata(name, namespace, labels, owner),
        "addressType": "IPv6" if ":" in address else "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
    }


def build_owner(job_name: str, namespace: str | None) -> dict[str, Any]:
    """The job-level owner made when no pipeline engine owns the master pod: deleting it
    garbage-collects every pod, Service and Secret of the job."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner_name(job_name), namespace, job_labels(job_name), None),
        "data": {
            "about": "Owns the pods, Services and Secret of elastic-step job "
            f"{job_name}; delete it to remove them all."
        },
    }


#: The uid --dry-run shows in owner references (the real one exists once the owner does).
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def plan_job_objects(
    job_name: str,
    options: KubernetesOptions,
    specs: Sequence[LaunchSpec],
    port: int,
    *,
    namespace: str | None,
    image: str,
) -> list[dict[str, Any]]:
    """Every object the master creates when the job starts, in order: the owner ConfigMap
    (what a master with no pipeline engine makes), the Secret, the master Service, then the
    PS and worker pods."""
    owner_object = build_owner(job_name, namespace)
    owner = owner_reference("v1", "ConfigMap", owner_name(job_name), PLACEHOLDER_UID)
    keys = list(
        dict.fromkeys(secret_key(k, v) for spec in specs for k, v in spec.secret_env.items())
    )
    objects = [
        owner_object,
        placeholder_secret(job_name, namespace, keys, owner),
        build_master_service(job_name, namespace, port, owner),
    ]
    objects += [
        build_pod(spec, options, job_name=job_name, namespace=namespace, image=image, owner=owner)
        for spec in specs
    ]
    return objects
