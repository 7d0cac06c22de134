"""The Kubernetes state store against a real API server, as the elastic-step-master
ServiceAccount: ConfigMaps for the head, snapshot parts and journal chunks, a Lease for fencing.
It passes the StateStore contract (tests/contracts/state_store_contract.py).

Leases last 2 s here, so takeovers take seconds; every wait is bounded.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from uuid import uuid4

import pytest
from k8s_helpers import wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from state_store_contract import STATE, StateStoreContract, record

from elastic_step.errors import InputError
from elastic_step.master.state_store import (
    SavedState,
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
    create_state_store,
)
from elastic_step.master.state_store.kube_configmaps import MANAGED_BY_LABEL
from elastic_step.master.state_store.kubernetes_store import (
    JOB_LABEL,
    PART_LABEL,
    KubernetesStateStore,
    KubernetesStoreSettings,
)

LEASE_S = 2
FAST = KubernetesStoreSettings(lease_duration_s=LEASE_S, retry_for_s=10.0)
WAIT_S = 20.0  # the most any wait below takes; most take milliseconds, takeovers ~LEASE_S
RBAC_HINT = "(the master's Role lacks it: see manifests/rbac.yaml)"


@pytest.fixture
def job(cluster, admin_api) -> Iterator[str]:
    name = f"ks-{uuid4().hex[:8]}"
    yield name
    core = client.CoreV1Api(admin_api)
    core.delete_collection_namespaced_config_map(
        cluster.namespace, label_selector=f"{JOB_LABEL}={name}"
    )
    with suppress(ApiException):
        client.CoordinationV1Api(admin_api).delete_namespaced_lease(
            f"{name}-master", cluster.namespace
        )


@pytest.fixture
def make(cluster, sa_api, job) -> Iterator[Callable[..., KubernetesStateStore]]:
    """Makes stores of the test's job, as the ServiceAccount; stops their threads at the end."""
    stores: list[KubernetesStateStore] = []

    def make(kube: KubernetesStoreSettings = FAST, **kwargs) -> KubernetesStateStore:
        store = KubernetesStateStore(
            job, cluster.namespace, kube_settings=kube, api_client=sa_api, **kwargs
        )
        stores.append(store)
        return store

    yield make
    for store in stores:
        with suppress(Exception):
            store._crash()


@pytest.fixture
def new_store(make) -> Callable[[], KubernetesStateStore]:
    return make


class TestKubernetesStateStoreContract(StateStoreContract):
    wait_s = WAIT_S
    group_commit_records = 5000
    writes_per_record = 1 / 50

    def count_writes(self, store: KubernetesStateStore, monkeypatch: pytest.MonkeyPatch) -> list:
        requests: list[str] = []
        real_call = store._api.call

        def counting_call(verb, resource, name, *args, **kwargs):
            requests.append(f"{verb} {resource}")
            return real_call(verb, resource, name, *args, **kwargs)

        monkeypatch.setattr(store._api, "call", counting_call)
        return requests


def owner(make, name: str = "master", **kwargs) -> KubernetesStateStore:
    store = make(**kwargs)
    store.acquire(name, timeout_s=WAIT_S)
    return store


def objects(sa_api, namespace: str, job: str) -> dict[str, client.V1ConfigMap]:
    """The job's state ConfigMaps by name, listed by label."""
    listed = client.CoreV1Api(sa_api).list_namespaced_config_map(
        namespace, label_selector=f"{JOB_LABEL}={job}"
    )
    return {cm.metadata.name: cm for cm in listed.items}


def part_names(sa_api, namespace: str, job: str, part: str) -> set[str]:
    return {
        name
        for name, cm in objects(sa_api, namespace, job).items()
        if cm.metadata.labels[PART_LABEL] == part
    }


def head_of(sa_api, namespace: str, job: str) -> dict:
    cm = client.CoreV1Api(sa_api).read_namespaced_config_map(f"{job}-state", namespace)
    return json.loads(cm.data["head"])


def named_by(head: dict) -> set[str]:
    parts = head["snapshot"]["parts"] if head["snapshot"] else []
    return {*parts, *(entry["name"] for entry in head["journal"])}


def lease_spec(sa_api, namespace: str, job: str) -> client.V1LeaseSpec:
    return client.CoordinationV1Api(sa_api).read_namespaced_lease(f"{job}-master", namespace).spec


# -- append, snapshot, load --


def test_every_object_carries_the_labels_and_the_owner_reference_and_is_collected_with_it(
    make, sa_api, cluster, job
) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    job_owner = core.create_namespaced_config_map(
        ns, {"metadata": {"name": f"{job}-owner", "labels": {MANAGED_BY_LABEL: "elastic-step"}}}
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": job_owner.metadata.name,
        "uid": job_owner.metadata.uid,
    }
    store = owner(make, owner_reference=reference)
    store.append(record(1))
    store.snapshot(STATE)
    store.append(record(2))
    store.close()

    found = objects(sa_api, ns, job)
    assert {cm.metadata.labels[PART_LABEL] for cm in found.values()} == {
        "head",
        "snapshot",
        "journal",
    }
    lease = client.CoordinationV1Api(sa_api).read_namespaced_lease(f"{job}-master", ns)
    for metadata in [*(cm.metadata for cm in found.values()), lease.metadata]:
        assert metadata.labels[JOB_LABEL] == job
        assert metadata.labels["app.kubernetes.io/managed-by"] == "elastic-step"
        assert [r.uid for r in metadata.owner_references] == [job_owner.metadata.uid]

    core.delete_namespaced_config_map(job_owner.metadata.name, ns)

    def collected() -> bool:
        if objects(sa_api, ns, job):
            return False
        try:
            client.CoordinationV1Api(sa_api).read_namespaced_lease(f"{job}-master", ns)
        except ApiException as err:
            return err.status == 404
        return False

    wait_for("the garbage collector to delete the state", collected, timeout=90)


# -- compaction and chunking --


def test_a_durable_snapshot_deletes_the_chunks_and_parts_it_replaces(
    make, sa_api, cluster, job
) -> None:
    ns = cluster.namespace
    store = owner(make, kube=replace(FAST, journal_chunk_bytes=1024))
    for i in range(100):
        store.append(record(i))
        if i % 10 == 9:
            store.flush(WAIT_S)
    before = part_names(sa_api, ns, job, "journal")
    assert len(before) >= 5  # 100 records of ~60 bytes, 1 KiB chunks

    store.snapshot({"upto": 99})
    store.append(record(100))
    store.append(record(101))
    store.flush(WAIT_S)
    # Records are numbered from 1: the snapshot covers 1..100, the new chunk starts at 101.
    assert part_names(sa_api, ns, job, "journal") == {f"{job}-state-journal-101-t1"}
    first_parts = part_names(sa_api, ns, job, "snapshot")
    assert first_parts == {f"{job}-state-snapshot-1-t1-0"}

    store.snapshot({"upto": 101})
    store.flush(WAIT_S)
    assert part_names(sa_api, ns, job, "journal") == set()
    assert part_names(sa_api, ns, job, "snapshot") == {f"{job}-state-snapshot-2-t1-0"}
    store.append(record(102))
    store.close()

    head = head_of(sa_api, ns, job)
    assert set(objects(sa_api, ns, job)) == {f"{job}-state", *named_by(head)}
    assert make().load() == SavedState({"upto": 101}, [record(102)])


def test_a_snapshot_larger_than_one_object_is_cut_into_parts_and_loads_back(
    make, sa_api, cluster, job
) -> None:
    big = {
        "blob": "x" * 2_500_000,
        "tasks": [{"id": i, "shard": f"s{i % 7}"} for i in range(2000)],
        "text": "naïve ünïcode ✓",  # non-ASCII: escaped, so the parts cut anywhere
    }
    store = owner(make)
    started = time.monotonic()
    store.snapshot(big)
    store.append(record(1))
    store.flush(WAIT_S)
    write_s = time.monotonic() - started

    found = objects(sa_api, cluster.namespace, job)
    parts = sorted(n for n, cm in found.items() if cm.metadata.labels[PART_LABEL] == "snapshot")
    assert parts == [f"{job}-state-snapshot-1-t1-{k}" for k in range(3)]  # 2.6 MB / 900 KiB
    for name in parts:
        assert len(found[name].data["part"]) <= 900 * 1024
        assert found[name].immutable
    started = time.monotonic()
    assert make().load() == SavedState(big, [record(1)])
    load_s = time.monotonic() - started
    store.close()
    print(f"\n2.6 MB snapshot: written in {write_s:.2f} s, loaded in {load_s:.2f} s")
    assert write_s < WAIT_S and load_s < WAIT_S


def test_the_journal_rolls_over_to_new_chunks_and_a_record_too_big_for_one_fails_the_writer(
    make, sa_api, cluster, job
) -> None:
    kube = replace(FAST, journal_chunk_bytes=1024, object_bytes=4096)
    store = owner(make, kube=kube)
    records = [record(i) for i in range(200)]
    for i, r in enumerate(records):
        store.append(r)
        if i % 25 == 24:
            store.flush(WAIT_S)
    store.flush(WAIT_S)
    head = head_of(sa_api, cluster.namespace, job)
    assert len(head["journal"]) >= 10
    assert [e["first"] for e in head["journal"]] == sorted(e["first"] for e in head["journal"])
    assert make().load() == SavedState(None, records)

    store.append({"blob": "y" * 5000})
    with pytest.raises(StateStoreError, match=r"record 201 is 5\d\d\d bytes as JSON; .* at most"):
        store.flush(WAIT_S)
    with pytest.raises(StateStoreError, match="record 201"):
        store.append(record(0))
    with pytest.raises(StateStoreError):
        store.close()
    assert make().load() == SavedState(None, records)


# -- crashes --


@pytest.mark.parametrize("step", ["records", "journal", "snapshot-part", "head", "delete"])
def test_a_crash_at_any_step_of_a_snapshot_loads_a_consistent_state(
    make, sa_api, cluster, job, step: str
) -> None:
    ns = cluster.namespace
    kube = replace(FAST, journal_chunk_bytes=1024, object_bytes=4096)  # several parts
    first = owner(make, "first", kube=kube)
    old = {"old": True}
    first.snapshot(old)
    for i in range(3):
        first.append(record(i))
    first.flush(WAIT_S)

    holding, go = threading.Event(), threading.Event()

    def crash_at(name: str) -> None:
        if name == "batch" and not holding.is_set():
            holding.set()  # the writer holds record 3's batch while the next one gathers
            go.wait(WAIT_S)
        elif name == step:
            raise StateStoreError(f"crash at {step} (simulated)")

    first._on_step = crash_at
    first.append(record(3))
    assert holding.wait(WAIT_S)
    new_state = {**STATE, "padding": "z" * 10_000}  # three parts of 4 KiB
    first.snapshot(new_state)  # covers records 0..3
    first.append(record(4))
    go.set()
    with pytest.raises(StateStoreError, match="simulated"):
        first.flush(WAIT_S)
    first._crash()  # the process dies: no release, no more renewals

    committed = step in ("head", "delete")
    expected = (
        SavedState(new_state, [record(4)])
        if committed
        else SavedState(old, [record(i) for i in range(4)])
    )
    assert make().load() == expected
    left = set(objects(sa_api, ns, job))
    named = {f"{job}-state", *named_by(head_of(sa_api, ns, job))}
    if step != "records":
        assert left - named  # what the crash left: new chunk and parts, or old ones

    started = time.monotonic()
    second = owner(make, "second")
    takeover_s = time.monotonic() - started
    assert takeover_s < LEASE_S + 5
    assert second.load() == expected
    head = head_of(sa_api, ns, job)
    assert head["token"] == 2
    assert set(objects(sa_api, ns, job)) == {f"{job}-state", *named_by(head)}  # swept
    second.append(record(5))
    second.close()
    assert make().load() == replace(expected, records=[*expected.records, record(5)])


def test_a_crash_before_the_head_is_replaced_leaves_the_old_state_whole(
    make, sa_api, cluster, job
) -> None:
    """Made by hand: the old head and the objects it names are back, the new snapshot's parts
    and chunk are there but unnamed, as a crash right before the head's update leaves them."""
    ns = cluster.namespace
    core = client.CoreV1Api(sa_api)
    store = owner(make)
    store.snapshot({"old": True})
    for i in range(3):
        store.append(record(i))
    store.flush(WAIT_S)
    saved = objects(sa_api, ns, job)
    store.snapshot(STATE)
    store.append(record(3))
    store.close()
    assert make().load() == SavedState(STATE, [record(3)])

    for name, cm in saved.items():
        body = {"metadata": {"name": name, "labels": cm.metadata.labels}, "data": cm.data}
        if name == f"{job}-state":
            core.patch_namespaced_config_map(name, ns, {"data": cm.data})
        else:
            core.create_namespaced_config_map(ns, body)
    loaded = make().load()
    assert loaded == SavedState({"old": True}, [record(i) for i in range(3)])

    store = owner(make, "next")
    assert set(objects(sa_api, ns, job)) == set(saved)  # the unnamed new ones are swept
    store.append(record(99))
    store.close()
    assert make().load() == SavedState({"old": True}, [*loaded.records, record(99)])


def test_a_damaged_record_ends_the_replay_and_the_next_owner_writes_after_it(
    make, sa_api, cluster, job
) -> None:
    ns = cluster.namespace
    store = owner(make)
    for i in range(5):
        store.append(record(i))
        store.flush(WAIT_S)  # a batch, so a data key, each
    store.close()
    (chunk,) = part_names(sa_api, ns, job, "journal")
    client.CoreV1Api(sa_api).patch_namespaced_config_map(
        chunk,
        ns,
        {"data": {f"{4:020d}": '{"op": "task_d'}},  # record 4 of 5, cut short
    )
    before = [record(i) for i in range(3)]
    assert make().load() == SavedState(None, before)

    after = client.CoreV1Api(sa_api).read_namespaced_config_map(chunk, ns).data
    store = owner(make)  # cuts the journal there: record 4's and 5's keys go, set aside
    data = client.CoreV1Api(sa_api).read_namespaced_config_map(chunk, ns).data
    assert sorted(data) == [f"{seq:020d}" for seq in (1, 2, 3)]
    store.append(record(99))
    store.close()
    assert make().load() == SavedState(None, [*before, record(99)])
    # What followed the damage is kept, out of the state and of the sweep, never deleted.
    owner(make).close()  # another takeover sweeps what the head does not name
    (aside,) = part_names(sa_api, ns, job, "set-aside")
    assert aside == f"{chunk}-set-aside-t2"
    kept = client.CoreV1Api(sa_api).read_namespaced_config_map(aside, ns).data
    assert kept == {key: after[key] for key in (f"{4:020d}", f"{5:020d}")}


def test_damage_in_an_early_chunk_sets_the_later_chunks_aside_never_deletes_them(
    make, sa_api, cluster, job
) -> None:
    ns = cluster.namespace
    kube = replace(FAST, journal_chunk_bytes=1024, object_bytes=4096)
    store = owner(make, kube=kube)
    for i in range(60):
        store.append(record(i))
        if i % 10 == 9:
            store.flush(WAIT_S)
    store.close()
    journal = head_of(sa_api, ns, job)["journal"]
    assert len(journal) >= 3
    first, later = journal[0]["name"], [e["name"] for e in journal[1:]]
    core = client.CoreV1Api(sa_api)
    keys = sorted(core.read_namespaced_config_map(first, ns).data)
    core.patch_namespaced_config_map(first, ns, {"data": {keys[0]: '{"op": "task_d'}})
    kept = {name: core.read_namespaced_config_map(name, ns).data for name in later}

    owner(make, kube=kube).close()  # cuts the journal in its first chunk
    owner(make, kube=kube).close()  # another takeover sweeps what the head does not name
    assert [e["name"] for e in head_of(sa_api, ns, job)["journal"]] == [first]
    assert part_names(sa_api, ns, job, "set-aside") >= set(later)
    for name, data in kept.items():
        assert core.read_namespaced_config_map(name, ns).data == data


# -- the lease --


def test_a_second_owner_cannot_acquire_while_the_first_renews(make) -> None:
    first = owner(make, "first-master")
    contender = make()
    started = time.monotonic()
    with pytest.raises(StateStoreLockedError) as info:
        contender.acquire("second-master", timeout_s=LEASE_S + 1.0)  # longer than the lease
    waited = time.monotonic() - started
    assert LEASE_S + 1.0 <= waited < LEASE_S + 1.0 + 5
    assert "is held by first-master (token 1, renewed" in str(info.value)
    assert f"waited {LEASE_S + 1.0:g} s for it" in str(info.value)
    first.close()


def test_closing_releases_the_lease_at_once(make, sa_api, cluster, job) -> None:
    first = owner(make, "first")
    first.close()
    assert lease_spec(sa_api, cluster.namespace, job).holder_identity is None
    started = time.monotonic()
    assert make().acquire("second", timeout_s=WAIT_S) == 2
    assert time.monotonic() - started < LEASE_S / 2


def test_a_crashed_owner_s_lease_runs_out_and_a_successor_takes_over(make) -> None:
    first = owner(make, "first")
    first.append(record(1))
    first.flush(WAIT_S)
    first._crash()
    started = time.monotonic()
    second = make()
    assert second.acquire("second", timeout_s=WAIT_S) == 2
    waited = time.monotonic() - started
    assert LEASE_S / 2 <= waited < LEASE_S + 5
    assert second.load() == SavedState(None, [record(1)])
    second.close()


@pytest.mark.parametrize("caught_by", ["the renewal before the write", "the conditional write"])
def test_an_owner_that_stopped_renewing_is_fenced_and_never_overwrites_its_successor(
    make, sa_api, cluster, job, caught_by: str
) -> None:
    ns = cluster.namespace
    first = owner(make, "first")
    first.append({"by": "first", "n": 0})
    first.flush(WAIT_S)
    # A paused or cut-off master: its renewals stop, its writer lives on.
    first._lease.stop_renewing()

    second = make()
    started = time.monotonic()
    assert second.acquire("second", timeout_s=WAIT_S) == 2
    assert time.monotonic() - started < LEASE_S + 5
    assert second.load() == SavedState(None, [{"by": "first", "n": 0}])
    second.append({"by": "second", "n": 1})
    second.flush(WAIT_S)

    if caught_by == "the conditional write":
        # Its clock says the lease still holds (a pause right after the check, say): the write
        # itself must fail, being conditional on what the successor changed.
        first._lease._valid_until = float("inf")
        why = r"journal chunk .* changed under it"
    else:
        why = r"\(held by second\)"
    first.append({"by": "first", "n": 1})
    with pytest.raises(StateStoreFencedError, match=r"token is 1, the job's is now 2") as info:
        first.flush(WAIT_S)
    assert info.match(why)
    with pytest.raises(StateStoreFencedError):
        first.append({"by": "first", "n": 2})
    with pytest.raises(StateStoreFencedError):
        first.snapshot(STATE)
    with pytest.raises(StateStoreFencedError):
        first.close()

    second.append({"by": "second", "n": 2})
    second.flush(WAIT_S)
    expected = [{"by": "first", "n": 0}, {"by": "second", "n": 1}, {"by": "second", "n": 2}]
    assert make().load() == SavedState(None, expected)
    everything = json.dumps([cm.data for cm in objects(sa_api, ns, job).values()])
    assert everything.count('\\"by\\":\\"first\\"') == 1  # only its record before the takeover
    spec = lease_spec(sa_api, ns, job)
    assert (spec.holder_identity, spec.lease_transitions) == ("second", 2)
    second.close()


def test_a_renewal_that_finds_another_holder_fences_the_owner(
    make, admin_api, cluster, job
) -> None:
    first = owner(make, "first")
    client.CoordinationV1Api(admin_api).patch_namespaced_lease(
        f"{job}-master",
        cluster.namespace,
        {"spec": {"holderIdentity": "intruder", "leaseTransitions": 7}},
    )

    def fenced() -> bool:
        try:
            first.append(record(1))
        except StateStoreFencedError as e:
            return "held by intruder" in str(e)
        return False

    wait_for("the renewal to fence the owner", fenced, timeout=LEASE_S * 3, interval=0.05)
    with pytest.raises(StateStoreFencedError):
        first.close()
    spec = (
        client.CoordinationV1Api(admin_api)
        .read_namespaced_lease(f"{job}-master", cluster.namespace)
        .spec
    )
    assert spec.holder_identity == "intruder"  # not released: it was not first's


def test_a_new_owner_s_token_is_above_the_head_s_even_if_the_lease_is_deleted(
    make, admin_api, cluster, job
) -> None:
    owner(make).close()
    client.CoordinationV1Api(admin_api).delete_namespaced_lease(f"{job}-master", cluster.namespace)
    store = make()
    assert store.acquire("master", timeout_s=WAIT_S) == 2
    store.close()


# -- errors, the registry --


def test_a_namespace_the_role_does_not_cover_gives_one_clear_line(sa_api) -> None:
    store = KubernetesStateStore("job-x", "default", kube_settings=FAST, api_client=sa_api)
    with pytest.raises(StateStoreError) as info:
        store.load()
    message = str(info.value)
    assert message.startswith('cannot get configmaps in namespace "default": forbidden: ')
    assert message.endswith(RBAC_HINT) and "\n" not in message
    with pytest.raises(StateStoreError) as info:
        store.acquire("master", timeout_s=1)
    message = str(info.value)
    assert message.startswith(
        'cannot get leases.coordination.k8s.io in namespace "default": forbidden: '
    )
    assert message.endswith(RBAC_HINT) and "\n" not in message


def test_create_state_store_kubernetes_uses_the_kubeconfig_and_its_namespace(
    cluster, job, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.sa_kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    store = create_state_store("kubernetes", str(tmp_path), job_name=job)
    assert isinstance(store, KubernetesStateStore)
    assert store.namespace == cluster.namespace
    assert store.describe() == (
        f"Kubernetes ConfigMaps {cluster.namespace}/{job}-state* "
        f"(lease {cluster.namespace}/{job}-master)"
    )
    store.acquire("master", timeout_s=WAIT_S)
    store.snapshot(STATE)
    store.close()
    again = create_state_store(
        "kubernetes", str(tmp_path), job_name=job, namespace=cluster.namespace
    )
    assert again.load() == SavedState(STATE, [])
    assert not list(tmp_path.iterdir())
    with pytest.raises(InputError, match="needs the job's name"):
        create_state_store("kubernetes", str(tmp_path))
    with pytest.raises(InputError, match="job name must be lowercase"):
        create_state_store("kubernetes", str(tmp_path), job_name="Job_1")


def test_the_job_secret_is_a_secret_not_in_the_state(cluster, sa_api) -> None:
    first = KubernetesStateStore("secret-job", cluster.namespace, api_client=sa_api)
    first.acquire("master-a", timeout_s=10)
    secret = first.job_secret()
    assert len(secret) == 64 and first.job_secret() == secret
    first.snapshot({"phase": "running"})
    first.close()
    # Another owner (a restarted master) gets the same secret; it is in no ConfigMap.
    second = KubernetesStateStore("secret-job", cluster.namespace, api_client=sa_api)
    second.acquire("master-b", timeout_s=60)
    assert second.job_secret() == secret
    second.close()
    configmaps = client.CoreV1Api(sa_api).list_namespaced_config_map(
        cluster.namespace, label_selector="elastic-step/job=secret-job"
    )
    assert configmaps.items and all(secret not in str(cm.data) for cm in configmaps.items)
    # Derived from the namespace's key by the job's name: another job has another secret,
    # and no Secret holds either.
    other = KubernetesStateStore("other-job", cluster.namespace, api_client=sa_api)
    assert other.job_secret() not in ("", secret)
    other.close()


def test_a_namespace_key_without_a_usable_key_is_one_clear_error(cluster, admin_api) -> None:
    ns = "es-bad-keys"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": ns}})
    try:
        core.create_namespaced_secret(
            ns, {"metadata": {"name": "elastic-step-keys"}, "stringData": {"key": "short"}}
        )
        store = KubernetesStateStore("a-job", ns, api_client=admin_api)
        with pytest.raises(StateStoreError, match="its key has 5 characters; elastic-step wants"):
            store.job_secret()
        core.replace_namespaced_secret(
            "elastic-step-keys", ns, {"metadata": {"name": "elastic-step-keys"}, "data": {}}
        )
        with pytest.raises(StateStoreError, match=r"has no key 'key'.*kubectl create secret"):
            store.job_secret()
        store.close()
    finally:
        core.delete_namespace(ns)
