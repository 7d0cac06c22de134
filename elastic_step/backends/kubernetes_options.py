"""The Kubernetes backend's options: one typed, validated dataclass, and the parsers of the
values that its flags take (the flags themselves are the CLI's: elastic_step/kubernetes_flags.py).

:class:`KubernetesOptions` is what the backend is built from. Every field is checked when the
object is made, and a bad value raises :class:`InputError` with a message that names the flag,
the value and the rule it broke. Tests: tests/unit/test_kubernetes_options.py.

Parsing of the repeatable flags' values:

- ``--node-selector KEY=VALUE``
- ``--toleration KEY[=VALUE]:EFFECT`` (EFFECT: NoSchedule, PreferNoSchedule or NoExecute;
  with a value the operator is Equal, without one Exists)
- ``--volume claim=NAME,mount=/PATH[,readonly][,subpath=DIR]``: a PersistentVolumeClaim
  mounted at /PATH in every worker and PS pod (shared data and checkpoints)
- ``--env NAME=VALUE``
- ``--image-pull-secret NAME``
- ``--storage-secret NAME``: a Secret whose object-store credentials every worker and PS pod
  gets as environment variables (see ``kubernetes_pods.storage_secret_env``)
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from elastic_step.errors import InputError

#: Environment variables the backend sets in every pod; ``--env`` may not set them.
RESERVED_ENV = frozenset(
    {
        "ELASTIC_STEP_HOST",
        "ELASTIC_STEP_INSTANCE",
        "ELASTIC_STEP_CPU_LIMIT",
        "ELASTIC_STEP_JOB_SECRET",
        "ELASTIC_STEP_POD_NAME",
    }
)
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_QUANTITY = re.compile(
    r"(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+)"
)
_SUFFIX_SCALE = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def quantity_value(text: str) -> float | None:
    """The value of a Kubernetes resource quantity ("500m", "2", "4Gi", "1e3"); None if it
    is not one."""
    match = _QUANTITY.fullmatch(text)
    if not match:
        return None
    suffix = match.group("suffix")
    scale = 10.0 ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX_SCALE[suffix]
    return float(match.group("number")) * scale


def is_dns_label(text: str) -> bool:
    return len(text) <= 63 and bool(_DNS_LABEL.fullmatch(text))


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= 253 and bool(_DNS_SUBDOMAIN.fullmatch(text))


def is_label_key(text: str) -> bool:
    prefix, slash, name = text.rpartition("/")
    if slash and not is_dns_subdomain(prefix):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))


def is_label_value(text: str) -> bool:
    return text == "" or (len(text) <= 63 and bool(_LABEL_NAME.fullmatch(text)))


@dataclass(frozen=True, kw_only=True)
class RoleResources:
    """What each pod of one role asks for: requests and limits are equal (Guaranteed QoS when
    both CPU and memory are set). None leaves a resource unset."""

    cpu: str | None = None
    memory: str | None = None
    gpu: int = 0


@dataclass(frozen=True, kw_only=True)
class Toleration:
    key: str
    effect: str
    value: str | None = None

    def manifest(self) -> dict[str, str]:
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


@dataclass(frozen=True, kw_only=True)
class Volume:
    """A PersistentVolumeClaim mounted into every worker and PS pod."""

    claim: str
    mount: str
    read_only: bool = False
    sub_path: str | None = None


@dataclass(frozen=True, kw_only=True)
class KubernetesOptions:
    """How the Kubernetes backend makes the job's pods. Every field is validated on creation."""

    #: Where the job's objects live; None: the master pod's own namespace, or the
    #: kubeconfig context's, or "default".
    namespace: str | None = None
    #: The image of the worker and PS pods; None: the master pod's own image.
    image: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    #: The ServiceAccount of the worker and PS pods; they never call the API, so no token is
    #: mounted either way (a pod template may change that).
    service_account: str | None = None
    worker: RoleResources = field(default_factory=RoleResources)
    ps: RoleResources = field(default_factory=RoleResources)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    #: The PriorityClass of worker pods (and of PS pods when there is no high class).
    worker_priority_class: str | None = None
    #: The PriorityClass of PS pods and of ``high_priority_fraction`` of the worker slots.
    high_priority_class: str | None = None
    high_priority_fraction: float = 0.0
    volumes: tuple[Volume, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    #: A pod manifest merged into every pod: {"metadata": {...}, "spec": {...}}.
    pod_template: Mapping[str, Any] | None = None
    #: Where the pod template came from, for messages.
    pod_template_path: str | None = None
    #: None: in-cluster configuration inside a pod, the default kubeconfig otherwise.
    kubeconfig: str | None = None
    #: A Secret with the object store's credentials, for s3:// and minio:// data and output.
    storage_secret: str | None = None

    def __post_init__(self) -> None:
        if self.namespace is not None and not is_dns_label(self.namespace):
            raise _bad("--namespace", self.namespace, "must be a DNS-1123 label")
        if self.image is not None and (not self.image or re.search(r"\s", self.image)):
            raise _bad("--image", self.image, "must be a non-empty image reference with no spaces")
        if self.image_pull_policy is not None and self.image_pull_policy not in PULL_POLICIES:
            raise _bad("--image-pull-policy", self.image_pull_policy, _one_of(PULL_POLICIES))
        for name in self.image_pull_secrets:
            if not is_dns_subdomain(name):
                raise _bad("--image-pull-secret", name, "must be a Secret's name (DNS-1123)")
        if self.service_account is not None and not is_dns_subdomain(self.service_account):
            raise _bad("--service-account", self.service_account, "must be a ServiceAccount's name")
        for role, resources in (("worker", self.worker), ("ps", self.ps)):
            for kind, value in (("cpu", resources.cpu), ("memory", resources.memory)):
                if value is not None:
                    number = quantity_value(value)
                    if number is None or number <= 0:
                        raise _bad(
                            f"--{role}-{kind}",
                            value,
                            "must be a positive Kubernetes quantity such as "
                            + ("500m or 2" if kind == "cpu" else "512Mi or 4Gi"),
                        )
                    if kind == "cpu" and number < 1e-3:
                        raise _bad(f"--{role}-cpu", value, "must be at least 1m")
            if resources.gpu < 0:
                raise _bad(f"--{role}-gpu", resources.gpu, "must be >= 0")
        for key, value in self.node_selector.items():
            if not is_label_key(key) or not is_label_value(value):
                raise _bad(
                    "--node-selector",
                    f"{key}={value}",
                    "must be KEY=VALUE with a valid label key and value",
                )
        for toleration in self.tolerations:
            if not is_label_key(toleration.key) or toleration.effect not in TAINT_EFFECTS:
                raise _bad(
                    "--toleration",
                    _toleration_text(toleration),
                    "must be KEY[=VALUE]:EFFECT with EFFECT " + ", ".join(TAINT_EFFECTS),
                )
            if toleration.value is not None and not is_label_value(toleration.value):
                raise _bad(
                    "--toleration", _toleration_text(toleration), "has an invalid taint value"
                )
        for flag, name in (
            ("--worker-priority-class", self.worker_priority_class),
            ("--high-priority-class", self.high_priority_class),
        ):
            if name is not None and not is_dns_subdomain(name):
                raise _bad(flag, name, "must be a PriorityClass's name (DNS-1123)")
        fraction = self.high_priority_fraction
        if not (math.isfinite(fraction) and 0.0 <= fraction <= 1.0):
            raise _bad("--high-priority-fraction", fraction, "must be between 0 and 1")
        if fraction > 0 and self.high_priority_class is None:
            raise _bad(
                "--high-priority-fraction", fraction, "needs --high-priority-class to be set"
            )
        mounts: set[str] = set()
        for volume in self.volumes:
            text = _volume_text(volume)
            if not is_dns_subdomain(volume.claim):
                raise _bad("--volume", text, "claim= must name a PersistentVolumeClaim")
            if not volume.mount.startswith("/") or ":" in volume.mount:
                raise _bad("--volume", text, "mount= must be an absolute path with no ':'")
            if volume.mount in mounts:
                raise _bad("--volume", text, "mounts a path another --volume already mounts")
            mounts.add(volume.mount)
            if volume.sub_path is not None and (
                not volume.sub_path
                or volume.sub_path.startswith("/")
                or ".." in volume.sub_path.split("/")
            ):
                raise _bad("--volume", text, "subpath= must be a relative path without '..'")
        for name, value in self.env.items():
            if not _ENV_NAME.fullmatch(name):
                raise _bad("--env", f"{name}={value}", "must be NAME=VALUE with a valid name")
            if name in RESERVED_ENV:
                raise _bad("--env", f"{name}={value}", "sets a variable that elastic-step sets")
        if self.pod_template is not None:
            check_pod_template(self.pod_template, self.pod_template_path or "--pod-template")
        if self.storage_secret is not None and not is_dns_subdomain(self.storage_secret):
            raise _bad(
                "--storage-secret", self.storage_secret, "must be a Secret's name (DNS-1123)"
            )
        if self.kubeconfig is not None and not os.path.isfile(self.kubeconfig):
            raise _bad("--kubeconfig", self.kubeconfig, "must be an existing file")

    def resources_for(self, role: str) -> RoleResources:
        return self.ps if role == "ps" else self.worker


def _bad(flag: str, value: object, rule: str) -> InputError:
    return InputError(f"{flag} {rule}, got '{value}'")


def _one_of(values: Sequence[str]) -> str:
    return "must be one of " + ", ".join(values)


def _toleration_text(t: Toleration) -> str:
    return f"{t.key}{'' if t.value is None else '=' + t.value}:{t.effect}"


def _volume_text(v: Volume) -> str:
    text = f"claim={v.claim},mount={v.mount}"
    if v.read_only:
        text += ",readonly"
    if v.sub_path is not None:
        text += f",subpath={v.sub_path}"
    return text


# -- the pod template --

#: What a pod template may not set: the backend owns these.
_TEMPLATE_FORBIDDEN_METADATA = ("name", "generateName", "namespace", "ownerReferences")


def check_pod_template(template: Mapping[str, Any], where: str) -> None:
    """Checks the normalized template ({"metadata", "spec"}); InputError names the problem."""

    def bad(rule: str) -> InputError:
        return InputError(f"--pod-template {where}: {rule}")

    metadata, spec = template.get("metadata") or {}, template.get("spec") or {}
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        raise bad("metadata and spec must be mappings")
    for key in _TEMPLATE_FORBIDDEN_METADATA:
        if key in metadata:
            raise bad(f"metadata.{key} is set by elastic-step; remove it")
    for key in ("labels", "annotations"):
        values = metadata.get(key) or {}
        if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            raise bad(f"metadata.{key} must map strings to strings (quote numbers)")
    if spec.get("restartPolicy", "Never") != "Never":
        raise bad(
            f"spec.restartPolicy must be Never (the master replaces pods), not "
            f"{spec.get('restartPolicy')}"
        )
    for key in ("containers", "initContainers", "volumes"):
        items = spec.get(key)
        if items is None:
            continue
        if not isinstance(items, list) or not all(
            isinstance(i, Mapping) and isinstance(i.get("name"), str) for i in items
        ):
            raise bad(f"spec.{key} must be a list of mappings, each with a name")


def load_pod_template(path: str) -> dict[str, Any]:
    """Reads a pod template: a Pod manifest, a PodTemplateSpec ({metadata, spec}) or a bare pod
    spec. Returns it as {"metadata": {...}, "spec": {...}}."""
    try:
        with open(path) as f:
            document = yaml.safe_load(f)
    except OSError as e:
        raise InputError(f"--pod-template cannot read {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise InputError(f"--pod-template {path} is not valid YAML: {e}") from e
    if not isinstance(document, Mapping):
        raise InputError(f"--pod-template {path} must hold a mapping (a Pod or a pod spec)")
    kind = document.get("kind")
    if kind is not None and kind != "Pod":
        raise InputError(f"--pod-template {path} must be a Pod or a pod spec, got kind {kind}")
    if "spec" in document or "metadata" in document or kind:
        template = {
            "metadata": dict(document.get("metadata") or {}),
            "spec": dict(document.get("spec") or {}),
        }
    else:
        template = {"metadata": {}, "spec": dict(document)}
    check_pod_template(template, path)
    return template


def parse_key_value(flag: str, text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``flag``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise _bad(flag, text, "must be KEY=VALUE")
    return key, value


def parse_toleration(text: str) -> Toleration:
    """``KEY[=VALUE]:EFFECT``."""
    head, sep, effect = text.rpartition(":")
    if not sep or not head:
        raise _bad("--toleration", text, "must be KEY[=VALUE]:EFFECT")
    key, eq, value = head.partition("=")
    return Toleration(key=key, value=value if eq else None, effect=effect)


def parse_volume(text: str) -> Volume:
    """``claim=NAME,mount=/PATH[,readonly][,subpath=DIR]``."""
    fields: dict[str, str] = {}
    read_only = False
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if key == "readonly" and not sep:
            read_only = True
        elif sep and key in ("claim", "mount", "subpath") and key not in fields:
            fields[key] = value
        else:
            raise _bad("--volume", text, "must be claim=NAME,mount=/PATH[,readonly][,subpath=DIR]")
    if "claim" not in fields or "mount" not in fields:
        raise _bad("--volume", text, "needs both claim=NAME and mount=/PATH")
    return Volume(
        claim=fields["claim"],
        mount=fields["mount"],
        read_only=read_only,
        sub_path=fields.get("subpath"),
    )
