"""The kubernetes backend's objects beside the instances' pods: the job's owner, Secret and
Service, and the master's own pod.

**Objects.** The job has a Secret ``<job>-secret`` (the values of each
``LaunchSpec.secret_env`` under ``<VARIABLE>.<hash>``, which the pod reads with
``secretKeyRef``: no secret value is ever in a pod spec or a log; a key goes when the last
instance that read it has ended) and a headless Service ``<job>-master`` with no selector,
whose EndpointSlice of the same name holds the current master pod's IP: each master writes
its own there when it starts serving, so instances reach
``<job>-master.<namespace>.svc:<port>`` whichever pod the master runs in now, and no pod is
ever patched. The manifests are built in ``kubernetes_pods.py``.

**Ownership.** Pods, the Service and the Secret are never owned by the master's pod: the
garbage collector would delete them when that pod is replaced, which is exactly when a new
master must adopt them. They are owned by the run's object, found from the master pod's own
``ownerReferences`` (its controller reference):

- an Argo ``Workflow`` (``argoproj.io``; KFP runs on Argo): deleting the run removes all;
- a ``batch/v1`` ``Job`` (the master run as a Kubernetes Job, with no pipeline engine);
- otherwise (no owner, another kind, or a master outside the cluster) a ConfigMap
  ``<job>-owner`` that :class:`JobObjects` creates: deleting it garbage-collects everything.

Owner references are not controller references and do not block the owner's deletion. The
job's state on the cluster (its Lease and state ConfigMaps) has the same owner, so a
stopped job resumes, and only deleting the run (or the owner ConfigMap) forgets it: the
backend's ``remove_job_objects`` removes the Service, its EndpointSlice and the Secret,
never the owner.

**The master's pod.** Found by ``ELASTIC_STEP_POD_NAME`` (set it from the downward API
``metadata.name``), else ``KFP_POD_NAME``, else the hostname when in a pod. The master
listens on ``ELASTIC_STEP_POD_IP`` (downward API ``status.podIP``) or on its pod's
``status.podIP``. Outside a pod (development) there is no Service: it listens on and
advertises this machine's address toward the API server.

Tests: against an API server, tests/k8s/test_k8s_backend.py (the Service, the Secret and
each kind of owner) and tests/k8s/test_k8s_backend_job.py (a master pod replaced mid-job).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import BackendError, LaunchSpec
from elastic_step.backends.kubernetes_client import Kube, KubeCallError
from elastic_step.backends.kubernetes_run import engine_restarts
from elastic_step.kube.client import address_toward

log = logging.getLogger(__name__)


def master_pod_from_env(in_cluster: bool) -> str | None:
    """The master's own pod name: ``ELASTIC_STEP_POD_NAME``, ``KFP_POD_NAME``, or the hostname
    in a pod (a pod's hostname is its name unless its spec sets another)."""
    for variable in ("ELASTIC_STEP_POD_NAME", "KFP_POD_NAME"):
        if os.environ.get(variable):
            return os.environ[variable]
    return socket.gethostname() if in_cluster else None


class JobObjects:
    """The owner, image, Secret and Service of job ``job``, and its master's pod
    (``master_pod``, None for a master outside the cluster).

    ``image`` is the pods' image, None for the master pod's own; ``on_owner(owner)`` is called
    once the owner is found (the backend then watches it for a stop)."""

    def __init__(
        self,
        kube: Kube,
        job: str,
        master_pod: str | None,
        image: str | None,
        on_owner: Callable[[dict[str, Any]], None],
    ) -> None:
        self._kube = kube
        self._job = job
        self._namespace = kube.namespace
        self._master_pod = master_pod
        self._image = image
        self._on_owner = on_owner
        self._setup_lock = threading.Lock()
        self._owner: dict[str, Any] | None = None
        #: What the job's Secret holds, as this master put it there.
        self._secret_values: dict[str, str] = {}
        # Which instances this master launched read each key (a key shared by a role's
        # instances goes only when the last of them has ended).
        self._secret_users: dict[str, set[str]] = {}
        self._secret_made = False
        self._listen_host: str | None = None

    @property
    def owner(self) -> dict[str, Any] | None:
        """The ownerReference of the job's objects; None until :meth:`ensure_setup`."""
        return self._owner

    @property
    def image(self) -> str | None:
        """The pods' image; None until :meth:`ensure_setup` when it is the master pod's."""
        return self._image

    def read_master_pod(self) -> dict[str, Any]:
        return self._kube.read_pod(self._master_pod)

    # -- the owner and the image --

    def ensure_setup(self) -> None:
        """Finds the owner of the job's objects and the image, once."""
        with self._setup_lock:
            if self._owner is not None:
                return
            owner = None
            if self._master_pod is not None:
                pod = self.read_master_pod()
                owner = self._run_owner(pod)
                if self._image is None:
                    containers = pod["spec"]["containers"]
                    main = next((c for c in containers if c["name"] == pods.CONTAINER), None)
                    self._image = (main or containers[0])["image"]
            if owner is None:
                owner = self._make_owner()
            if self._image is None:
                raise BackendError(
                    "--image is required when the master does not run in a pod "
                    "(in a pod, the default is the master pod's own image)"
                )
            self._owner = owner
            self._on_owner(owner)
            log.info(
                "kubernetes: job %s in namespace %s, objects owned by %s %s",
                self._job,
                self._namespace,
                owner["kind"],
                owner["name"],
            )

    @staticmethod
    def _run_owner(master_pod: dict[str, Any]) -> dict[str, Any] | None:
        """The run's object from the master pod's controller reference: an Argo Workflow or a
        batch Job; None for anything else (the master pod's own ReplicaSet, say)."""
        for ref in master_pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and engine_restarts(ref):
                return pods.owner_reference(ref["apiVersion"], ref["kind"], ref["name"], ref["uid"])
        return None

    def _make_owner(self) -> dict[str, Any]:
        name = pods.owner_name(self._job)
        core = self._kube.core
        try:
            made = self._kube.call(
                "create",
                "configmaps",
                core.create_namespaced_config_map,
                self._namespace,
                pods.build_owner(self._job, self._namespace),
                retry_for_s=30,
            )
        except KubeCallError as e:
            if not e.already_exists:
                raise
            made = self._kube.call(
                "get", "configmaps", core.read_namespaced_config_map, name, self._namespace
            )
        return pods.owner_reference("v1", "ConfigMap", name, made["metadata"]["uid"])

    # -- the Secret --

    def ensure_secret(self, spec: LaunchSpec) -> None:
        """Puts the instance's secret values into the job's Secret, before its pod exists."""
        values = {pods.secret_key(k, v): v for k, v in spec.secret_env.items()}
        with self._setup_lock:
            for key in values:
                self._secret_users.setdefault(key, set()).add(spec.name)
            if all(self._secret_values.get(k) == v for k, v in values.items()):
                return
            body = pods.build_secret(self._job, self._namespace, values, self._owner)
            core = self._kube.core
            made = False
            if not self._secret_made:
                try:
                    self._kube.call(
                        "create", "secrets", core.create_namespaced_secret, self._namespace, body
                    )
                    made = True
                except KubeCallError as e:
                    if not e.already_exists:
                        raise
            if not made:
                # The Secret exists (this master's, or an earlier one's): add the keys. A
                # patch needs no read, and the master may not read Secrets.
                self._kube.call(
                    "patch",
                    "secrets",
                    core.patch_namespaced_secret,
                    pods.secret_name(self._job),
                    self._namespace,
                    {"data": body["data"]},
                )
            self._secret_made = True
            self._secret_values.update(values)

    def note_adopted_keys(self, listed: list[dict[str, Any]]) -> None:
        """Keeps the Secret's keys that pods made by an earlier master read: this master
        does not know when their last reader ends, and a pod still Pending reads its keys
        when it starts (the values that the master derives come out the same again)."""
        name = pods.secret_name(self._job)
        with self._setup_lock:
            for pod in listed:
                labels = (pod.get("metadata") or {}).get("labels") or {}
                reader = f"adopted {labels.get(pods.LABEL_INSTANCE, '?')}"
                for container in (pod.get("spec") or {}).get("containers") or []:
                    for env in container.get("env") or []:
                        ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
                        if ref.get("name") == name and ref.get("key"):
                            self._secret_users.setdefault(ref["key"], set()).add(reader)

    def forget_secret(self, spec: LaunchSpec | None) -> None:
        """Takes an ended instance's keys out of the job's Secret (its pod read them when it
        started), so that the Secret does not grow with every replacement."""
        if spec is None or not spec.secret_env:
            return  # adopted: its keys go with the Secret at the end of the job
        with self._setup_lock:
            keys = []
            for key in (pods.secret_key(k, v) for k, v in spec.secret_env.items()):
                users = self._secret_users.get(key, set())
                users.discard(spec.name)
                if not users and self._secret_values.pop(key, None) is not None:
                    self._secret_users.pop(key, None)
                    keys.append(key)
            if not keys:
                return
            # Under the lock: a key shared with an instance being launched must not be
            # taken out after that launch put it back.
            try:
                self._kube.call(
                    "patch",
                    "secrets",
                    self._kube.core.patch_namespaced_secret,
                    pods.secret_name(self._job),
                    self._namespace,
                    {"data": dict.fromkeys(keys)},
                )
            except KubeCallError as e:
                if not e.not_found:
                    log.warning("%s", e)

    # -- the master's pod and its Service --

    def advertise(self, port: int) -> str:
        """Makes the Service name the master's pod on ``port``; its address."""
        self.ensure_setup()
        self._ensure_service(port)
        self._ensure_endpoints(self.listen_host(), port)
        return f"{pods.service_name(self._job)}.{self._namespace}.svc:{port}"

    def _ensure_endpoints(self, address: str, port: int) -> None:
        """Writes this master's pod IP into the Service's EndpointSlice: the name follows
        the master from pod to pod with no pod label, so the master needs no pod patch."""
        body = pods.build_master_endpoints(self._job, self._namespace, address, port, self._owner)
        discovery = self._kube.discovery
        if self._created("endpointslices", discovery.create_namespaced_endpoint_slice, body):
            return
        # An earlier master's: point it here. A list body is sent as a JSON patch, which
        # replaces the endpoints and ports rather than merging them.
        self._kube.call(
            "patch",
            "endpointslices",
            discovery.patch_namespaced_endpoint_slice,
            pods.service_name(self._job),
            self._namespace,
            [
                {"op": "replace", "path": "/endpoints", "value": body["endpoints"]},
                {"op": "replace", "path": "/ports", "value": body["ports"]},
            ],
            retry_for_s=30,
        )

    def _created(self, resource: str, create, body: dict[str, Any]) -> bool:
        """Creates ``body``; False when an object of its name is there already."""
        try:
            self._kube.call("create", resource, create, self._namespace, body, retry_for_s=30)
        except KubeCallError as e:
            if not e.already_exists:
                raise
            return False
        return True

    def _ensure_service(self, port: int) -> None:
        core = self._kube.core
        body = pods.build_master_service(self._job, self._namespace, port, self._owner)
        if self._created("services", core.create_namespaced_service, body):
            return
        name = pods.service_name(self._job)
        existing = self._kube.call(
            "get", "services", core.read_namespaced_service, name, self._namespace
        )
        wanted, spec = body["spec"], existing.get("spec") or {}

        def ports(items: list[dict[str, Any]]) -> list[tuple]:
            return [(p.get("name"), p.get("port"), p.get("targetPort")) for p in items]

        if not spec.get("selector") and ports(spec.get("ports") or []) == ports(wanted["ports"]):
            return
        # A list body is sent as a JSON patch: the ports are replaced, not merged; a selector
        # (an older master's Service chose its pod by label) is removed.
        patch = [{"op": "replace", "path": "/spec/ports", "value": wanted["ports"]}]
        if spec.get("selector"):
            patch.append({"op": "remove", "path": "/spec/selector"})
        self._kube.call(
            "patch", "services", core.patch_namespaced_service, name, self._namespace, patch
        )

    def listen_host(self) -> str:
        """The address the master listens on (found once)."""
        if self._listen_host is None:
            self._listen_host = self._find_listen_host()
        return self._listen_host

    def _find_listen_host(self) -> str:
        if os.environ.get("ELASTIC_STEP_POD_IP"):
            return os.environ["ELASTIC_STEP_POD_IP"]
        if self._master_pod is None:
            return address_toward(self._kube.api_client)
        deadline = time.monotonic() + 30
        while True:
            pod = self.read_master_pod()
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                return ip
            if time.monotonic() > deadline:
                raise BackendError(f"the master's pod {self._master_pod} has no IP after 30 s")
            time.sleep(0.5)
