"""elastic_step/kube/calls.py and objects.py: the one retry policy, the one-line errors, and the
errors' types for the backend and the state store (no cluster needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from elastic_step.backends.api import BackendError
from elastic_step.backends.kubernetes_client import Kube, KubeCallError
from elastic_step.errors import ElasticStepError
from elastic_step.kube import calls
from elastic_step.kube.calls import METADATA_LIST, KubeCalls, KubeError, backoff_s
from elastic_step.master.state_store.api import StateStoreError
from elastic_step.master.state_store.kubernetes_store import KubeStoreError, StoreObjects


class FakeTime:
    """Stands in for the time module of calls.py: sleeping moves the clock, at once."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    monkeypatch.setattr(calls, "time", fake)
    return fake


def answer(data: bytes = b'{"ok": true}') -> SimpleNamespace:
    return SimpleNamespace(data=data, release_conn=lambda: None)


def refusal(status: int, reason: str = "", message: str = "", **headers: str) -> ApiException:
    error = ApiException(status=status, reason=reason or "Refused")
    if message or reason:
        error.body = f'{{"kind": "Status", "reason": "{reason}", "message": "{message}"}}'.encode()
    error.headers = {k.replace("_", "-"): v for k, v in headers.items()}
    return error


def scripted(*outcomes):
    """A method that raises or answers as scripted, one outcome per call; records kwargs."""
    seen: list[dict] = []

    def method(*args, **kwargs):
        seen.append(kwargs)
        outcome = outcomes[min(len(seen), len(outcomes)) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    method.seen = seen
    return method


def api(retry_for_s: float = 5.0, cls: type[KubeCalls] = KubeCalls) -> KubeCalls:
    return cls(client.ApiClient(), "ns", timeout=(1.0, 1.0), retry_for_s=retry_for_s)


# -- the retry policy --


def test_429_5xx_and_no_answer_are_retried_with_the_request_timeout(clock) -> None:
    method = scripted(
        refusal(503, "ServiceUnavailable"),
        refusal(429, "TooManyRequests"),
        urllib3.exceptions.ReadTimeoutError(None, "/api", "timed out"),
        ApiException(status=0, reason="SSLError"),  # the client's own failure: no answer
        answer(),
    )
    assert api().call("patch", "configmaps", method) == {"ok": True}
    assert len(method.seen) == 5
    assert all(kwargs["_request_timeout"] == (1.0, 1.0) for kwargs in method.seen)
    assert all(kwargs["_preload_content"] is False for kwargs in method.seen)
    # Capped exponential backoff with jitter: 0.05, 0.1, 0.2, 0.4, each ±20 %.
    for pause, base in zip(clock.sleeps, [0.05, 0.1, 0.2, 0.4], strict=True):
        assert 0.8 * base <= pause <= 1.2 * base


def test_retry_after_is_honoured_up_to_a_bound_and_the_time_left(clock) -> None:
    method = scripted(refusal(429, "TooManyRequests", Retry_After="1.5"), answer())
    assert api().call("list", "pods", method) == {"ok": True}
    assert clock.sleeps == [1.5]
    clock.sleeps.clear()
    method = scripted(refusal(503, "ServiceUnavailable", Retry_After="3600"), answer())
    api(retry_for_s=60).call("list", "pods", method)
    assert clock.sleeps == [calls.RETRY_AFTER_CAP_S]
    clock.sleeps.clear()
    method = scripted(refusal(503, "ServiceUnavailable", Retry_After="3"), answer())
    api(retry_for_s=1).call("list", "pods", method)
    assert clock.sleeps == [1.0]


def test_retries_stop_when_the_time_runs_out_with_one_line(clock) -> None:
    started = clock.now
    down = scripted(refusal(500, "InternalError", "etcd\\nleader changed"))
    with pytest.raises(KubeError) as info:
        api(retry_for_s=3).call("get", "configmaps", down, object_name="x")
    assert clock.now - started <= 3.0
    attempts = len(down.seen)
    assert 3 < attempts < 20
    assert str(info.value) == (
        'cannot get configmaps/x in namespace "ns": HTTP 500: etcd leader changed '
        f"({attempts} attempts in 3 s)"
    )
    assert info.value.status == 500 and info.value.transient


def test_with_no_retry_time_a_call_is_tried_once(clock) -> None:
    down = scripted(refusal(503, "ServiceUnavailable", "busy"))
    with pytest.raises(KubeError) as info:
        api(retry_for_s=0).call("delete", "pods", down)
    assert len(down.seen) == 1 and not clock.sleeps
    assert str(info.value) == 'cannot delete pods in namespace "ns": HTTP 503: busy'


def test_a_refusal_is_not_retried(clock) -> None:
    for status in (400, 401, 403, 404, 409, 422):
        method = scripted(refusal(status, "Whatever", "no"))
        with pytest.raises(KubeError):
            api().call("create", "configmaps", method)
        assert len(method.seen) == 1
    assert not clock.sleeps


def test_backoff_is_capped_exponential_with_jitter() -> None:
    for attempt, base in [(1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (6, 10.0), (50, 10.0)]:
        assert 0.8 * base <= backoff_s(attempt) <= 1.2 * base
    assert 0.8 * 30 <= backoff_s(9, first_s=1.0, cap_s=30.0) <= 1.2 * 30


# -- the one-line errors --


def test_errors_name_verb_resource_and_namespace_in_one_line(clock) -> None:
    forbidden = scripted(
        refusal(403, "Forbidden", 'configmaps \\"x\\" is forbidden: User \\"sa\\"\\ncannot get')
    )
    with pytest.raises(KubeError) as info:
        api().call("get", "configmaps", forbidden, object_name="x")
    assert str(info.value) == (
        'cannot get configmaps in namespace "ns": forbidden: configmaps "x" is forbidden: '
        'User "sa" cannot get (the master\'s Role lacks it: see manifests/rbac.yaml)'
    )
    assert info.value.forbidden and not info.value.capacity
    policy = "elastic-step-master may delete only ... (manifests/admission-policy.yaml)"
    with pytest.raises(KubeError) as info:
        api().call("delete", "pods", scripted(refusal(403, "Forbidden", policy)), object_name="x")
    assert str(info.value).endswith("(elastic-step's admission policy refused it)")
    with pytest.raises(KubeError) as info:
        api().call("patch", "leases", scripted(refusal(401, "Unauthorized", "Unauthorized")))
    assert str(info.value) == (
        'cannot patch leases in namespace "ns": unauthorized: the API server rejected this '
        "process's credentials"
    )
    no_answer = scripted(urllib3.exceptions.ReadTimeoutError(None, "/api", "timed out"))
    with pytest.raises(KubeError) as info:
        api(retry_for_s=0).call("get", "pods", no_answer)
    assert str(info.value).startswith(
        'cannot get pods in namespace "ns": no answer from the API server (ReadTimeoutError'
    )
    assert info.value.status is None and info.value.transient


def test_the_status_reason_tells_not_found_already_exists_and_conflict(clock) -> None:
    def error_of(status: int, reason: str) -> KubeError:
        with pytest.raises(KubeError) as info:
            api().call("create", "configmaps", scripted(refusal(status, reason, "m")))
        return info.value

    assert error_of(404, "NotFound").not_found
    exists = error_of(409, "AlreadyExists")
    assert exists.already_exists and not exists.conflict and exists.reason == "AlreadyExists"
    conflict = error_of(409, "Conflict")
    assert conflict.conflict and not conflict.already_exists
    quota = KubeError("create", "pods", "ml", 403, 'pods "p" is forbidden: exceeded quota: q')
    assert quota.capacity and not quota.forbidden and not quota.transient


def test_the_backend_and_the_store_get_their_own_error_types(clock) -> None:
    refused = scripted(refusal(403, "Forbidden", "no"))
    with pytest.raises(KubeCallError) as info:
        api(cls=Kube).call("create", "pods", refused)
    assert isinstance(info.value, BackendError) and isinstance(info.value, ElasticStepError)
    with pytest.raises(KubeStoreError) as stored:
        api(cls=StoreObjects).call("create", "configmaps", refused)
    assert isinstance(stored.value, StateStoreError) and isinstance(stored.value, KubeError)


# -- ConfigMaps, Secrets, Leases --


class FakeCore:
    def __init__(self, **methods) -> None:
        self.__dict__.update(methods)


def test_objects_read_none_when_missing_and_delete_what_is_gone(clock) -> None:
    objects = api(cls=StoreObjects)
    missing = scripted(refusal(404, "NotFound", "gone"))
    objects.core = FakeCore(
        read_namespaced_config_map=missing, delete_namespaced_config_map=missing
    )
    objects.coordination = FakeCore(read_namespaced_lease=missing)
    assert objects.get_configmap("x") is None
    assert objects.get_lease("x") is None
    objects.delete_configmap("x")
    created = scripted(refusal(409, "AlreadyExists", "exists"))
    read = scripted(answer(b'{"metadata": {"name": "s"}}'))
    objects.core = FakeCore(create_namespaced_secret=created, read_namespaced_secret=read)
    assert objects.get_or_create_secret({"metadata": {"name": "s"}}) == {"metadata": {"name": "s"}}


def test_a_metadata_list_asks_for_metadata_only(clock) -> None:
    objects = api(cls=StoreObjects)
    asked = {}

    def call_api(path, method, path_params, query, headers, **kwargs):
        asked.update(path=path, params=path_params, query=query, headers=headers)
        return answer(b'{"items": [{"metadata": {"name": "a"}}]}')

    objects.api_client = SimpleNamespace(call_api=call_api)
    assert objects.list_configmap_metadata("app=x") == [{"name": "a"}]
    assert asked == {
        "path": "/api/v1/namespaces/{namespace}/configmaps",
        "params": {"namespace": "ns"},
        "query": [("labelSelector", "app=x")],
        "headers": {"Accept": METADATA_LIST},
    }
