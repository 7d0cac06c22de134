"""The Kubernetes backend against the test control plane, beyond the Backend contract: how a
pod ended (deleted by someone else, preempted, evicted, stuck Terminating), pending pods,
quota, a watch that loses its place (410 Gone), refusals, the job's Secret and Service.

The backend acts as the elastic-step-master ServiceAccount, in a namespace where Pod Security
admission enforces the ``restricted`` standard; the admin stands in for the rest of the
cluster (a user deleting a pod, a drain, a higher-priority job).
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid

import pytest
import urllib3
import yaml
from backend_contract import SLEEP
from k8s_helpers import wait_for as poll
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from test_k8s_backend_support import (
    PY,
    SLEEP_THROUGH_SIGTERM,
    clean_namespace,
    make_backend,
    new_job_name,
    restricted_fixture,  # noqa: F401 - the fixture restricted
    restricted_pod,
    start_master_pod,
)

from elastic_step.backends import kubernetes_pods as pods
from elastic_step.backends.api import (
    EventKind,
    ExitReason,
    InstanceEvent,
    LaunchSpec,
    Role,
    StopKind,
    StopRequest,
)
from elastic_step.backends.kubernetes import KubernetesBackend
from elastic_step.backends.kubernetes_client import KubeCallError
from elastic_step.backends.kubernetes_options import RoleResources

START_S = 30.0
END_S = 60.0


@pytest.fixture
def admin(cluster, restricted):
    with cluster.admin() as api:
        yield client.CoreV1Api(api)
    clean_namespace(cluster, restricted.name)


@pytest.fixture
def master_pod(admin, restricted) -> str:
    return start_master_pod(admin, restricted.name)


@pytest.fixture
def backends():
    made: list[KubernetesBackend] = []
    yield made
    for backend in made:
        backend.close()


@pytest.fixture
def new_backend(restricted, master_pod, backends):
    """``new_backend(job=None, master_pod=<the stand-in master>, backend_kw=None, **options)``"""

    def make(job=None, master=master_pod, backend_kw=None, **options) -> KubernetesBackend:
        backend = make_backend(
            restricted.master_kubeconfig,
            restricted.name,
            job or new_job_name(),
            master,
            backend_kw=backend_kw,
            **options,
        )
        backends.append(backend)
        return backend

    return make


def wait_for(backend, name: str, kind: EventKind, timeout_s: float) -> InstanceEvent:
    """The first ``kind`` event of ``name``; other events stay (on the backend) for later
    calls."""
    pending: list[InstanceEvent] = backend.__dict__.setdefault("_test_events", [])
    deadline = time.monotonic() + timeout_s
    while True:
        for event in pending:
            if event.name == name and event.kind is kind:
                pending.remove(event)
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no {kind.value} event for {name} in {timeout_s} s: {pending}")
        pending += backend.next_events(0.2)


def spec(name: str, code: str = SLEEP, role: Role = Role.WORKER, index: int = 0, **kw):
    return LaunchSpec(name, role, index, [PY, "-c", code], **kw)


def read_pod(admin, namespace: str, name: str) -> client.V1Pod | None:
    try:
        return admin.read_namespaced_pod(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def exists(method, *args) -> bool:
    try:
        method(*args)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


# -- how pods end --


def test_a_pod_deleted_by_someone_else_is_deleted_not_a_fault(admin, restricted, new_backend):
    backend = new_backend()
    backend.launch(spec("worker-0"))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    admin.delete_namespaced_pod(f"{backend._job}-worker-0", restricted.name)
    event = wait_for(backend, "worker-0", EventKind.EXITED, END_S)
    assert event.reason is ExitReason.DELETED and not event.reason.is_fault
    assert "not by the master" in event.message


def test_a_preempted_pod_is_preempted(admin, restricted, new_backend):
    backend = new_backend(worker=RoleResources(cpu="3"), worker_priority_class="elastic-step-low")
    backend.launch(spec("worker-0"))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    # 3 of the node's 4 CPUs are taken: the high-priority pod fits only by preempting.
    high = restricted_pod(
        f"high-{uuid.uuid4().hex[:6]}",
        [PY, "-c", SLEEP],
        resources={"requests": {"cpu": "2"}, "limits": {"cpu": "2"}},
    )
    high["spec"]["priorityClassName"] = "elastic-step-high"
    admin.create_namespaced_pod(restricted.name, high)
    event = wait_for(backend, "worker-0", EventKind.EXITED, END_S)
    assert event.reason is ExitReason.PREEMPTED, event
    assert "PreemptionByScheduler" in event.message


def test_an_evicted_pod_is_evicted(admin, restricted, new_backend):
    backend = new_backend()
    backend.launch(spec("ps-0", role=Role.PS))
    wait_for(backend, "ps-0", EventKind.STARTED, START_S)
    name = f"{backend._job}-ps-0"
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=restricted.name))
    admin.create_namespaced_pod_eviction(name, restricted.name, eviction)
    event = wait_for(backend, "ps-0", EventKind.EXITED, END_S)
    assert event.reason is ExitReason.EVICTED, event
    assert "EvictionByEvictionAPI" in event.message


def test_a_pod_over_its_memory_limit_is_oom_killed_and_that_is_its_fault(new_backend):
    backend = new_backend(worker=RoleResources(memory="64Mi"))
    hog = (
        "import time; b = bytearray(512 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"
    )
    backend.launch(spec("worker-0", hog))
    event = wait_for(backend, "worker-0", EventKind.EXITED, END_S)
    assert event.reason is ExitReason.OOM_KILLED and event.reason.is_fault, event
    assert "OOMKilled" in event.message


def test_a_pod_stuck_terminating_is_lost(admin, restricted, new_backend):
    # Bound to a node that no kubelet serves, and held by a finalizer: like a pod on a lost
    # node, it stays Terminating after its deletion. (An unscheduled pod would do too, but
    # the pod garbage collector fails unscheduled terminating pods every 20 s, which races
    # the backend's own timeout; it waits 40 s before it fails pods of a missing node.)
    backend = new_backend(
        pod_template={"spec": {"nodeName": "lost-node"}},
        backend_kw={"terminating_timeout_s": 2.0},
    )
    backend.launch(spec("worker-0"))
    name = f"{backend._job}-worker-0"
    poll("the pod made", lambda: exists(admin.read_namespaced_pod, name, restricted.name))
    admin.patch_namespaced_pod(name, restricted.name, {"metadata": {"finalizers": ["test/hold"]}})
    try:
        backend.delete("worker-0", grace_period_s=1)
        event = wait_for(backend, "worker-0", EventKind.EXITED, 30)
        assert event.reason is ExitReason.LOST, event
        assert "stuck Terminating" in event.message and "by the master" in event.message
        assert read_pod(admin, restricted.name, name).metadata.deletion_timestamp
    finally:
        admin.patch_namespaced_pod(name, restricted.name, {"metadata": {"finalizers": None}})
        with contextlib.suppress(ApiException):
            admin.delete_namespaced_pod(name, restricted.name, grace_period_seconds=0)


# -- pending pods and quota --


def test_a_pod_that_does_not_fit_is_pending_then_starts_when_capacity_frees(
    admin, restricted, new_backend
):
    backend = new_backend(worker=RoleResources(cpu="3"))
    backend.launch(spec("worker-0"))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    backend.launch(spec("worker-1", index=1))
    pending = wait_for(backend, "worker-1", EventKind.PENDING, START_S)
    assert pending.message.startswith("Unschedulable: 0/1 nodes are available"), pending
    assert "Insufficient cpu" in pending.message
    backend.delete("worker-0", grace_period_s=1)
    assert wait_for(backend, "worker-0", EventKind.EXITED, END_S).reason is ExitReason.DELETED
    wait_for(backend, "worker-1", EventKind.STARTED, 90)


def test_a_create_refused_for_quota_stays_pending_and_is_retried(admin, restricted, new_backend):
    backend = new_backend()
    ns = restricted.name
    # The test cluster runs no quota controller: the quota's status is set here, and the
    # admission plugin counts from it.
    used = len(admin.list_namespaced_pod(ns).items)
    admin.create_namespaced_resource_quota(
        ns, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(used + 1)}}}
    )
    admin.patch_namespaced_resource_quota_status(
        "pods", ns, {"status": {"hard": {"pods": str(used + 1)}, "used": {"pods": str(used)}}}
    )
    try:
        backend.launch(spec("worker-0"))
        wait_for(backend, "worker-0", EventKind.STARTED, START_S)
        backend.launch(spec("worker-1", index=1))
        pending = wait_for(backend, "worker-1", EventKind.PENDING, START_S)
        assert "exceeded quota" in pending.message and "retrying in 5 s" in pending.message
        assert "\n" not in pending.message
    finally:
        admin.delete_namespaced_resource_quota("pods", ns)
    wait_for(backend, "worker-1", EventKind.STARTED, 30)


def test_a_create_that_was_made_after_all_is_found_not_refused(admin, restricted, new_backend):
    # An earlier attempt timed out on the client but was made: the create answers 409.
    backend = new_backend()
    body = pods.build_pod(
        spec("worker-0"),
        backend._options,
        job_name=backend._job,
        namespace=restricted.name,
        image="local/process",
        owner=None,
    )
    admin.create_namespaced_pod(restricted.name, body)
    backend.launch(spec("worker-0"))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    assert (
        len(
            admin.list_namespaced_pod(
                restricted.name, label_selector=f"{pods.LABEL_JOB}={backend._job}"
            ).items
        )
        == 1
    )


def test_a_pod_name_taken_by_another_pod_fails_the_instance(admin, restricted, new_backend):
    backend = new_backend()
    other = restricted_pod(f"{backend._job}-worker-0", [PY, "-c", SLEEP])
    admin.create_namespaced_pod(restricted.name, other)
    backend.launch(spec("worker-0"))
    event = wait_for(backend, "worker-0", EventKind.EXITED, START_S)
    assert event.reason is ExitReason.CRASHED and "is not instance worker-0" in event.message


class _CoreStandIn:
    """The core API passed through, but for the calls a subclass defines."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core

    def __getattr__(self, name):
        return getattr(self._core, name)


class _FailingCreates(_CoreStandIn):
    """The core API, except that the next ``failures`` pod creates fail as an overloaded or
    unreachable API server would (503, or no answer)."""

    def __init__(self, core: client.CoreV1Api, failures: int, status: int | None) -> None:
        super().__init__(core)
        self.failures = failures
        self._status = status

    def create_namespaced_pod(self, *args, **kwargs):
        if self.failures > 0:
            self.failures -= 1
            if self._status is None:
                raise urllib3.exceptions.ReadTimeoutError(None, "/api/v1/pods", "timed out")
            raise ApiException(status=self._status, reason="Service Unavailable")
        return self._core.create_namespaced_pod(*args, **kwargs)


@pytest.mark.parametrize("status", [503, None], ids=["503", "no-answer"])
def test_a_create_that_fails_for_now_is_retried(restricted, new_backend, status):
    backend = new_backend()
    backend._kube.core = _FailingCreates(backend._kube.core, 2, status)
    backend.launch(spec("worker-0"))
    pending = wait_for(backend, "worker-0", EventKind.PENDING, START_S)
    assert "not created yet" in pending.message and "retrying" in pending.message
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    assert backend._kube.core.failures == 0


def test_a_create_that_keeps_failing_is_lost_not_a_fault(restricted, new_backend):
    backend = new_backend(backend_kw={"create_retry_s": 2.0})
    backend._kube.core = _FailingCreates(backend._kube.core, 1000, 503)
    backend.launch(spec("worker-0"))
    event = wait_for(backend, "worker-0", EventKind.EXITED, 30)
    assert event.reason is ExitReason.LOST and "HTTP 503" in event.message


# -- the watch --


class _FakeStream:
    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    def stream(self, amt=None, decode_content=False):
        for line in self._lines:
            yield (line + "\n").encode()

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class _GoneOnce(_CoreStandIn):
    """The core API, except that the next watch answers 410 Gone (as a status or as an ERROR
    event in the stream): the apiserver's way of saying its resourceVersion is too old."""

    def __init__(self, core: client.CoreV1Api, in_stream: bool) -> None:
        super().__init__(core)
        self._in_stream = in_stream
        self.armed = True

    def list_namespaced_pod(self, *args, **kwargs):
        if kwargs.get("watch") and self.armed:
            self.armed = False
            if not self._in_stream:
                raise ApiException(status=410, reason="Gone")
            status = {
                "kind": "Status",
                "code": 410,
                "reason": "Expired",
                "message": "too old resource version: 1 (5)",
            }
            return _FakeStream([json.dumps({"type": "ERROR", "object": status})])
        return self._core.list_namespaced_pod(*args, **kwargs)


@pytest.mark.parametrize("in_stream", [False, True], ids=["410-status", "410-error-event"])
def test_the_watch_lists_again_after_410_and_misses_no_end(
    admin, restricted, new_backend, in_stream
):
    backend = new_backend()
    backend.launch(spec("worker-0", "import time; time.sleep(3)"))
    backend.launch(spec("worker-1", index=1))
    backend.launch(spec("worker-2", index=2))
    for name in ("worker-0", "worker-1", "worker-2"):
        wait_for(backend, name, EventKind.STARTED, START_S)
    backend._watch.stop()  # nobody watches while these happen:
    job, ns = backend._job, restricted.name
    admin.delete_namespaced_pod(f"{job}-worker-1", ns, grace_period_seconds=0)

    def ended() -> bool:
        pod = read_pod(admin, ns, f"{job}-worker-0")
        return pod.status.phase == "Succeeded" and read_pod(admin, ns, f"{job}-worker-1") is None

    poll("worker-0 to finish and worker-1 to be gone", ended, timeout=30)
    lists = backend._watch.lists
    backend._kube.core = _GoneOnce(backend._kube.core, in_stream)
    backend._watch.start(resource_version="1")
    first = wait_for(backend, "worker-0", EventKind.EXITED, 30)
    assert (first.reason, first.exit_code) == (ExitReason.COMPLETED, 0)
    second = wait_for(backend, "worker-1", EventKind.EXITED, 30)
    assert second.reason is ExitReason.LOST and "relist" in second.message
    assert backend._watch.lists == lists + 1 and not backend._kube.core.armed
    # Still watching: worker-2 did not end, and its end is seen.
    backend.delete("worker-2", grace_period_s=1)
    assert wait_for(backend, "worker-2", EventKind.EXITED, END_S).reason is ExitReason.DELETED


# -- refusals --


def test_a_forbidden_call_is_one_line_naming_verb_resource_and_namespace(
    restricted,
    backends,
):
    backend = make_backend(
        restricted.nobody_kubeconfig, restricted.name, new_job_name(), None, image="local/process"
    )
    backends.append(backend)
    with pytest.raises(KubeCallError) as refused:
        backend.list_instances()
    message = str(refused.value)
    assert message.startswith(f'cannot list pods in namespace "{restricted.name}": forbidden: ')
    assert "\n" not in message and "rbac.yaml" in message
    backend.launch(spec("worker-0"))
    event = wait_for(backend, "worker-0", EventKind.EXITED, START_S)
    assert event.reason is ExitReason.CRASHED  # the job's own setup: bounded by --max-restarts
    assert "\n" not in event.message
    assert f'cannot create configmaps in namespace "{restricted.name}": forbidden' in event.message


def test_a_pod_that_violates_pod_security_is_refused_in_one_line(restricted, new_backend):
    template = {
        "metadata": {},
        "spec": {"securityContext": {"runAsNonRoot": None}, "hostNetwork": True},
    }
    backend = new_backend(pod_template=template)
    backend.launch(spec("worker-0"))
    event = wait_for(backend, "worker-0", EventKind.EXITED, START_S)
    assert event.reason is ExitReason.CRASHED and "\n" not in event.message
    assert "cannot create pods" in event.message and "PodSecurity" in event.message


# -- the master's address, its disruption, the job's objects --


def test_the_master_service_follows_the_master_pod(admin, restricted, new_backend, master_pod):
    ns = restricted.name
    job = new_job_name()
    first = new_backend(job)
    assert first.listen_host() == admin.read_namespaced_pod(master_pod, ns).status.pod_ip
    assert first.advertise_master(5000) == f"{job}-master.{ns}.svc:5000"
    service = admin.read_namespaced_service(f"{job}-master", ns)
    assert service.spec.cluster_ip == "None" and not service.spec.selector
    discovery = client.DiscoveryV1Api(admin.api_client)

    def endpoints() -> tuple[list[str], list[int]]:
        found = discovery.read_namespaced_endpoint_slice(f"{job}-master", ns)
        return [a for e in found.endpoints for a in e.addresses], [p.port for p in found.ports]

    first_ip = admin.read_namespaced_pod(master_pod, ns).status.pod_ip
    assert endpoints() == ([first_ip], [5000])
    labels = admin.read_namespaced_pod(master_pod, ns).metadata.labels or {}
    assert pods.LABEL_MASTER not in labels  # no pod is patched

    # A restarted master, in another pod and on another port: the Service follows it.
    second_pod = start_master_pod(admin, ns)
    second = new_backend(job, master=second_pod)
    assert second.advertise_master(5001) == f"{job}-master.{ns}.svc:5001"
    second_ip = admin.read_namespaced_pod(second_pod, ns).status.pod_ip
    assert endpoints() == ([second_ip], [5001])
    ports = admin.read_namespaced_service(f"{job}-master", ns).spec.ports
    assert [(p.port, p.target_port) for p in ports] == [(5001, 5001)]


def test_an_eviction_of_the_master_pod_is_a_handover(admin, restricted, new_backend):
    # The master's pod is evicted (a node drain): the eviction API marks it DisruptionTarget
    # and deletes it, and the master reads that on its SIGTERM, within the grace period.
    ns = restricted.name
    master = start_master_pod(admin, ns, SLEEP_THROUGH_SIGTERM)
    backend = new_backend(master=master)
    assert backend.stop_request(signalled=True) is None
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=master, namespace=ns))
    admin.create_namespaced_pod_eviction(master, ns, eviction)
    assert read_pod(admin, ns, master).metadata.deletion_timestamp
    request = backend.stop_request(signalled=True)
    assert request == StopRequest(
        StopKind.HANDOVER, "EvictionByEvictionAPI: Eviction API: evicting"
    ), request


def test_a_deleted_owner_is_a_stop_seen_with_no_signal(admin, restricted, new_backend):
    # A bare master pod (nothing owns it): the backend makes the owner ConfigMap. Deleting it
    # is a stop of the run, which the backend's own poll sees within seconds.
    ns = restricted.name
    master = start_master_pod(admin, ns, SLEEP_THROUGH_SIGTERM)
    backend = new_backend(master=master)
    owner = backend.owner()
    assert owner.kind == "ConfigMap" and owner.api_version == "v1"
    assert backend.stop_request() is None
    admin.delete_namespaced_config_map(owner.name, ns)
    request = poll("the stop seen", backend.stop_request, timeout=10)
    assert request == StopRequest(StopKind.STOP, f"ConfigMap {owner.name} was deleted")


def test_secret_values_are_in_one_secret_and_never_in_a_pod_spec(admin, restricted, new_backend):
    backend = new_backend()
    # Each instance has a token of its own; a role's instances share a certificate.
    ca = {"ELASTIC_STEP_TLS_CA": "c3rt"}
    backend.launch(spec("ps-0", role=Role.PS, secret_env={"ELASTIC_STEP_TOKEN": "s3cr3t", **ca}))
    backend.launch(spec("worker-0", secret_env={"ELASTIC_STEP_TOKEN": "t0ken-0", **ca}))
    backend.launch(
        spec("worker-1", "pass", index=1, secret_env={"ELASTIC_STEP_TOKEN": "t0ken-1", **ca})
    )
    for name in ("ps-0", "worker-0", "worker-1"):
        wait_for(backend, name, EventKind.STARTED, START_S)
    ns, job = restricted.name, backend._job
    for name in ("ps-0", "worker-0", "worker-1"):
        pod = client.ApiClient().sanitize_for_serialization(
            admin.read_namespaced_pod(f"{job}-{name}", ns)
        )
        assert not {"s3cr3t", "t0ken-0", "t0ken-1", "c3rt"} & set(json.dumps(pod).split('"'))

    def secret() -> dict[str, str]:
        data = admin.read_namespaced_secret(f"{job}-secret", ns).data or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    # worker-1 has ended: its token is gone from the Secret; the certificate others still
    # read stays, once.
    assert wait_for(backend, "worker-1", EventKind.EXITED, END_S).reason is ExitReason.COMPLETED

    def values() -> list[str]:
        return sorted(secret().values())

    expected = ["c3rt", "s3cr3t", "t0ken-0"]
    poll("the ended instance's key to leave the Secret", lambda: values() == expected, timeout=10)

    # A restarted master adopts ps-0 and worker-0, launches worker-2 with the same
    # certificate, and worker-2 ends: the certificate's key stays, since the adopted pods
    # read it (one of them could still be Pending); worker-2's token goes.
    again = new_backend(job)
    assert {i.name for i in again.list_instances()} >= {"ps-0", "worker-0"}
    again.launch(spec("worker-2", "pass", index=2, secret_env={"ELASTIC_STEP_TOKEN": "t2", **ca}))
    assert wait_for(again, "worker-2", EventKind.EXITED, END_S).reason is ExitReason.COMPLETED
    poll("worker-2's token to leave the Secret", lambda: values() == expected, timeout=10)


def _owners(obj) -> list[tuple[str, str]]:
    return [(r.kind, r.name) for r in obj.metadata.owner_references or []]


def test_with_no_pipeline_engine_a_configmap_owns_everything(
    admin, restricted, new_backend, master_pod
):
    ns = restricted.name
    backend = new_backend()
    job = backend._job
    backend.advertise_master(5000)
    backend.launch(spec("worker-0", secret_env={"S": "v"}))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    owner = ("ConfigMap", f"{job}-owner")
    objects = {
        "pod": lambda: admin.read_namespaced_pod(f"{job}-worker-0", ns),
        "service": lambda: admin.read_namespaced_service(f"{job}-master", ns),
        "secret": lambda: admin.read_namespaced_secret(f"{job}-secret", ns),
    }
    for read in objects.values():
        assert _owners(read()) == [owner]  # never the master's pod
    assert not _owners(admin.read_namespaced_pod(master_pod, ns))

    admin.delete_namespaced_config_map(f"{job}-owner", ns, propagation_policy="Background")

    def collected() -> bool:
        return not any(exists(read) for read in objects.values())

    poll("the garbage collector to remove the job's objects", collected, timeout=90)
    assert wait_for(backend, "worker-0", EventKind.EXITED, END_S).reason is ExitReason.DELETED


def test_a_master_run_as_a_job_makes_the_job_the_owner(admin, restricted, new_backend, cluster):
    ns = restricted.name
    batch = client.BatchV1Api(admin.api_client)
    master = restricted_pod("unused", [PY, "-c", SLEEP])
    job_object = batch.create_namespaced_job(
        ns,
        {
            "metadata": {"name": f"master-{uuid.uuid4().hex[:6]}"},
            "spec": {"backoffLimit": 0, "template": {"metadata": {}, "spec": master["spec"]}},
        },
    )
    selector = f"batch.kubernetes.io/job-name={job_object.metadata.name}"

    def master_running() -> str | None:
        items = admin.list_namespaced_pod(ns, label_selector=selector).items
        running = [p for p in items if p.status.phase == "Running"]
        return running[0].metadata.name if running else None

    master_pod = poll("the Job's master pod Running", master_running, timeout=60)
    backend = new_backend(master=master_pod)
    job = backend._job
    backend.advertise_master(5000)
    backend.launch(spec("worker-0"))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    owner = ("Job", job_object.metadata.name)
    assert _owners(admin.read_namespaced_pod(f"{job}-worker-0", ns)) == [owner]
    assert _owners(admin.read_namespaced_service(f"{job}-master", ns)) == [owner]
    assert not exists(admin.read_namespaced_config_map, f"{job}-owner", ns)

    batch.delete_namespaced_job(job_object.metadata.name, ns, propagation_policy="Background")

    def collected() -> bool:
        return not exists(admin.read_namespaced_pod, f"{job}-worker-0", ns) and not exists(
            admin.read_namespaced_service, f"{job}-master", ns
        )

    poll("the garbage collector to remove the job's objects", collected, timeout=90)


def test_remove_job_objects_leaves_only_the_owner_within_20_s(admin, restricted, new_backend):
    ns = restricted.name
    backend = new_backend()
    job = backend._job
    backend.advertise_master(5000)
    secret_env = {"S": "v"}
    backend.launch(spec("ps-0", role=Role.PS, secret_env=secret_env))
    backend.launch(spec("worker-0", secret_env=secret_env))
    backend.launch(spec("worker-1", "pass", index=1, secret_env=secret_env))
    for name in ("ps-0", "worker-0"):
        wait_for(backend, name, EventKind.STARTED, START_S)
    wait_for(backend, "worker-1", EventKind.EXITED, END_S)  # its pod stays, Succeeded

    started = time.monotonic()  # what the master does when the run is stopped:
    for name in ("ps-0", "worker-0"):
        backend.delete(name, grace_period_s=3)
    backend.remove_job_objects()
    selector = pods.job_selector(job)

    def nothing_left() -> bool:
        return not (
            admin.list_namespaced_pod(ns, label_selector=selector).items
            or admin.list_namespaced_service(ns, label_selector=selector).items
            or admin.list_namespaced_secret(ns, label_selector=selector).items
        )

    poll("no pod, Service or Secret of the job", nothing_left, timeout=20)
    assert time.monotonic() - started < 20
    # The owner stays, and with it the job's state: only deleting the run forgets the job.
    configmaps = admin.list_namespaced_config_map(ns, label_selector=selector).items
    assert [c.metadata.name for c in configmaps] == [f"{job}-owner"]


# -- --dry-run --


def test_the_dry_run_objects_pass_server_side_validation_and_pod_security(
    cluster, restricted, capsys
):
    from elastic_step.cli import main

    template = cluster.workdir / "pod-template.yaml"
    template.write_text(
        "metadata:\n  labels:\n    team: ml\nspec:\n  terminationGracePeriodSeconds: 45\n"
    )
    argv = [
        "train", "--model-def", "model.py", "--data", "data/", "--output", "run/",
        "--backend", "kubernetes", "--dry-run", "--job-name", "dry-run-job",
        "--workers", "3", "--ps", "2", "--port", "7000",
        "--namespace", restricted.name, "--image", "registry.example/elastic-step:1",
        "--image-pull-policy", "IfNotPresent", "--image-pull-secret", "registry",
        "--service-account", "default",
        "--worker-cpu", "500m", "--worker-memory", "1Gi", "--ps-cpu", "1", "--ps-memory", "2Gi",
        "--node-selector", "kubernetes.io/os=linux", "--toleration", "dedicated=ml:NoSchedule",
        "--toleration", "spot:NoExecute",
        "--worker-priority-class", "elastic-step-low",
        "--high-priority-class", "elastic-step-high", "--high-priority-fraction", "0.34",
        "--volume", "claim=shared,mount=/shared", "--volume", "claim=data,mount=/data,readonly",
        "--env", "TF_CPP_MIN_LOG_LEVEL=2", "--pod-template", str(template),
    ]  # fmt: skip
    assert main(argv) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    kinds = [o["kind"] for o in objects]
    assert kinds == ["ConfigMap", "Secret", "Service"] + ["Pod"] * 5
    priorities = [o["spec"].get("priorityClassName") for o in objects[3:]]
    assert (
        priorities == ["elastic-step-high"] * 2 + ["elastic-step-high"] + ["elastic-step-low"] * 2
    )
    with _master_api(restricted) as api:
        for obj in objects:
            created = utils.create_from_dict(api, obj, namespace=restricted.name, dry_run="All")
            assert created, obj["metadata"]["name"]


def _master_api(restricted):
    from kubernetes import config

    return config.new_client_from_config(config_file=str(restricted.master_kubeconfig))


WORKFLOW_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "workflows.argoproj.io"},
    "spec": {
        "group": "argoproj.io",
        "names": {"kind": "Workflow", "plural": "workflows", "singular": "workflow"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def test_in_an_argo_step_the_workflow_owns_everything(admin, restricted, new_backend):
    """An Argo step pod's one owner is its Workflow (controller=true): the job's objects are
    owned by the Workflow, so deleting the run removes them, and a new step pod adopts them."""
    extensions = client.ApiextensionsV1Api(admin.api_client)
    try:
        extensions.create_custom_resource_definition(WORKFLOW_CRD)
    except ApiException as e:
        if e.status != 409:
            raise

    def established() -> bool:
        crd = extensions.read_custom_resource_definition("workflows.argoproj.io")
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    poll("the Workflow CRD", established, timeout=30)
    custom = client.CustomObjectsApi(admin.api_client)
    ns = restricted.name
    name = f"run-{uuid.uuid4().hex[:6]}"
    workflow = poll(
        "a Workflow",
        lambda: custom.create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", ns, "workflows",
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
             "metadata": {"name": name}, "spec": {}},
        ),
        timeout=30,
    )  # fmt: skip
    step = restricted_pod(f"{name}-train-123", [PY, "-c", SLEEP])
    step["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "name": name,
            "uid": workflow["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    admin.create_namespaced_pod(ns, step)
    poll(
        "the step pod Running",
        lambda: admin.read_namespaced_pod(step["metadata"]["name"], ns).status.phase == "Running",
    )
    backend = new_backend(master=step["metadata"]["name"])
    job = backend._job
    backend.advertise_master(5000)
    backend.launch(spec("worker-0", secret_env={"S": "v"}))
    wait_for(backend, "worker-0", EventKind.STARTED, START_S)
    owner = ("Workflow", name)
    assert _owners(admin.read_namespaced_pod(f"{job}-worker-0", ns)) == [owner]
    assert _owners(admin.read_namespaced_service(f"{job}-master", ns)) == [owner]
    assert _owners(admin.read_namespaced_secret(f"{job}-secret", ns)) == [owner]
    assert not exists(admin.read_namespaced_config_map, f"{job}-owner", ns)
    ref = admin.read_namespaced_pod(f"{job}-worker-0", ns).metadata.owner_references[0]
    assert not ref.controller and not ref.block_owner_deletion  # Argo must not take it as its own

    custom.delete_namespaced_custom_object(
        "argoproj.io", "v1alpha1", ns, "workflows", name, propagation_policy="Background"
    )

    def collected() -> bool:
        return not any(
            exists(read, f"{job}-{suffix}", ns)
            for read, suffix in (
                (admin.read_namespaced_pod, "worker-0"),
                (admin.read_namespaced_service, "master"),
                (admin.read_namespaced_secret, "secret"),
            )
        )

    poll("the garbage collector to remove the job's objects", collected, timeout=120)
