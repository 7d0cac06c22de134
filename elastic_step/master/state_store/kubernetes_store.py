"""A state store in Kubernetes objects, for a master that runs as a pod.

A new master pod of the same job (another name, another IP) takes over once the old one's
lease has run out, replays the state, and goes on; two masters of one job never both write.

Objects, all in the job's namespace, all labelled ``elastic-step/job: <job>`` and
``app.kubernetes.io/managed-by: elastic-step``, and all owned by the caller's owner reference
when one is given (deleting the owner then garbage-collects them)::

    Lease      <job>-master                               the fencing lease (kube_lease.py)
    ConfigMap  <job>-state                                the head, data {"head": JSON}
    ConfigMap  <job>-state-snapshot-<gen>-t<token>-<k>    part k of snapshot generation gen
                                                          (kube_snapshot.py)
    ConfigMap  <job>-state-journal-<first seq>-t<token>   a journal chunk (kube_journal.py)

and one Secret shared by the namespace's jobs, never deleted: ``elastic-step-keys``, the key
from which each job's secret is derived (:meth:`KubernetesStateStore.job_secret`).

The head names everything that counts::

    {"format": 1, "token": T, "generation": G,
     "snapshot": {"seq": S, "generation": G, "parts": [names], "bytes": n, "sha256": hex} | null,
     "journal": [{"name": chunk, "first": seq}, ...]}

An object the head does not name is left over from a crash and ignored; the next owner deletes
it when it takes over. A snapshot is a JSON document cut into parts of at most
``object_bytes`` (900 KiB by default), whose SHA-256 the head keeps (kube_snapshot.py); a
journal chunk holds one data key per batch, a record a line, until it holds
``journal_chunk_bytes`` (kube_journal.py). Names carry the creating owner's token, so no two
owners ever create the same name.

Writing (one background writer, batches from the GroupCommitter):

* records: one patch adds the batch to the head's last chunk. When that chunk is full, new
  chunks are created, then the head is updated to name them: the head update makes them count.
* a snapshot covering records up to S: (1) the batch's records up to S go to the journal as
  above; (2) its records after S go to new chunks starting at S+1, not yet named; (3) the
  snapshot's parts are created under a new generation; (4) the head is replaced by one naming
  the new snapshot and only the new chunks: this one update is the commit; (5) the old
  snapshot's parts and the old chunks are deleted (compaction).

A crash before (4) leaves the old head, which names the old snapshot and the old journal with
every record up to S; a crash after it leaves the new one. Either way a load is a prefix of
what was appended, and the garbage of the other side is never read.

Fencing. Every write is conditional on a resourceVersion: the head's (for the head) or the
current chunk's (for appending to it). A new owner, once it holds the Lease, (a) writes its
token into the head, conditional on the head it read, then (b) touches the head's last chunk,
and only then (c) reads the state. After (a) the old owner cannot commit anything; after (b) it
cannot append; so the state the new owner read is final, and any later write of the old owner
fails with 409 Conflict, which it reports as StateStoreFencedError. This holds even when the
old owner is paused past its lease's end and its clock misleads it. The Lease adds the waiting
(a contender waits for the lease to run out) and early detection: the renewal thread fences
the store as soon as it sees another holder, and a write renews first when the last renewal is
older than two thirds of the duration.

A reader needs no lease: it reads the head, then what the head names. If an object the head
named is gone and the head has changed meanwhile (the owner compacted underneath it), it reads
again.

This module holds the head and the order of the writes; the labels and the create of every
ConfigMap are kube_configmaps.py's.

Tests: against an API server, tests/k8s/test_k8s_state_store.py; the settings and the store's
errors, tests/unit/test_state_store.py and tests/unit/test_kube_calls.py.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kubernetes import client

from elastic_step.errors import InputError
from elastic_step.kube.calls import KubeError
from elastic_step.kube.client import default_namespace, load_api_client
from elastic_step.kube.objects import KubeObjects
from elastic_step.master.state_store.api import (
    Replayed,
    SavedState,
    StateStoreError,
    StateStoreFencedError,
    StateStoreSettings,
)
from elastic_step.master.state_store.committed_store import CommittedStore
from elastic_step.master.state_store.group_commit import GroupCommitter, PendingSnapshot
from elastic_step.master.state_store.journal import encode_json
from elastic_step.master.state_store.kube_configmaps import (
    JOB_LABEL,
    MANAGED_BY_LABEL,
    PART_LABEL,
    StateConfigMaps,
    data_of,
    rv_of,
    versioned_document,
)
from elastic_step.master.state_store.kube_journal import Cut, KubeJournal
from elastic_step.master.state_store.kube_lease import KubeLease
from elastic_step.master.state_store.kube_snapshot import KubeSnapshots

log = logging.getLogger("elastic_step.master.state_store")

#: The part label of journal ConfigMaps a repair set aside: kept, never read, never swept.
SET_ASIDE = "set-aside"
#: The namespace's key: the one Secret the master reads (see manifests/rbac.yaml).
KEYS_SECRET = "elastic-step-keys"

HEAD_FORMAT = 1
#: The API server refuses a ConfigMap whose data exceeds this.
MAX_OBJECT_DATA = 1024 * 1024
_ATTEMPTS = 20
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@dataclass(frozen=True)
class KubernetesStoreSettings:
    """What only the Kubernetes store needs; the defaults suit the master."""

    #: The Lease's leaseDurationSeconds: how long after the owner's last renewal a successor
    #: may take over. Renewed every third of it.
    lease_duration_s: int = 15
    #: One request's read timeout.
    request_timeout_s: float = 10.0
    #: How long one request is retried on 429, 5xx, timeouts and connection errors.
    retry_for_s: float = 30.0
    #: A journal chunk takes batches until it holds this much. Each batch re-stores its whole
    #: chunk in etcd, so smaller chunks write less; larger ones mean fewer objects.
    journal_chunk_bytes: int = 256 * 1024
    #: The most data one snapshot part (or one record) holds: a margin under the 1 MiB limit.
    object_bytes: int = 900 * 1024

    def __post_init__(self) -> None:
        if type(self.lease_duration_s) is not int or self.lease_duration_s < 1:
            raise ValueError(
                f"lease_duration_s must be a whole number of seconds >= 1, "
                f"got {self.lease_duration_s!r}"
            )
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if not self.retry_for_s >= 0:
            raise ValueError(f"retry_for_s must be >= 0, got {self.retry_for_s}")
        if not 1024 <= self.object_bytes <= MAX_OBJECT_DATA - 1024:
            raise ValueError(
                f"object_bytes must be between 1024 and {MAX_OBJECT_DATA - 1024}, "
                f"got {self.object_bytes}"
            )
        if not 1 <= self.journal_chunk_bytes <= self.object_bytes:
            raise ValueError(
                f"journal_chunk_bytes must be between 1 and object_bytes ({self.object_bytes}), "
                f"got {self.journal_chunk_bytes}"
            )


@dataclass
class Head:
    #: The resourceVersion it was read or written at; None for one not yet written.
    rv: str | None
    token: int
    generation: int = 0
    snapshot: dict | None = None
    journal: list[dict] = field(default_factory=list)

    def text(self) -> str:
        return encode_json(
            {
                "format": HEAD_FORMAT,
                "token": self.token,
                "generation": self.generation,
                "snapshot": self.snapshot,
                "journal": self.journal,
            }
        ).decode()

    def names(self) -> set[str]:
        """The snapshot parts and journal chunks it names."""
        parts = self.snapshot["parts"] if self.snapshot else []
        return {*parts, *(entry["name"] for entry in self.journal)}


@dataclass(frozen=True)
class Replay(Replayed):
    #: The journal chunks read, in order (up to the cut).
    chunks: list[dict]
    cut: Cut | None = None


class _Changed(Exception):
    """The owner changed the head while it was read."""


class KubeStoreError(KubeError, StateStoreError):
    """A refused or failed API request of the store (see :class:`KubeError`): a
    StateStoreError to the store's callers."""


class StoreObjects(KubeObjects):
    """The store's ConfigMaps, Secret and Lease, with errors raised as KubeStoreError."""

    error = KubeStoreError


def _default_api_client() -> tuple[client.ApiClient, str | None]:
    """In a pod, its ServiceAccount; elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    try:
        api_client, namespace, _ = load_api_client(None)
    except InputError as e:
        raise StateStoreError(
            f"the Kubernetes state store found no credentials (in-cluster or kubeconfig): {e}"
        ) from None
    return api_client, namespace


class KubernetesStateStore(CommittedStore):
    """The state of job ``job_name`` in ConfigMaps of ``namespace``, fenced by a Lease."""

    # Only a fenced owner stops writing: an API error reading the Lease is read again later.
    _lease_lost = StateStoreFencedError

    def __init__(
        self,
        job_name: str,
        namespace: str | None = None,
        settings: StateStoreSettings | None = None,
        *,
        kube_settings: KubernetesStoreSettings | None = None,
        api_client: client.ApiClient | None = None,
        owner_reference: dict | client.V1OwnerReference | None = None,
    ) -> None:
        if not (isinstance(job_name, str) and _DNS_LABEL.fullmatch(job_name)) or len(job_name) > 63:
            raise InputError(
                "the Kubernetes state store names its objects after the job: the job name must "
                "be lowercase letters, digits and '-', starting and ending with a letter or "
                f"digit, at most 63 characters; got {job_name!r}"
            )
        self._job = job_name
        self._settings = settings or StateStoreSettings()
        self._kube = kube_settings or KubernetesStoreSettings()
        if api_client is None:
            api_client, found = _default_api_client()
            namespace = namespace or found
        self._namespace = namespace or default_namespace() or "default"
        timeout_s = self._kube.request_timeout_s
        self._api = StoreObjects(
            api_client,
            self._namespace,
            timeout=(min(5.0, timeout_s), timeout_s),
            retry_for_s=self._kube.retry_for_s,
        )
        owner_references = (
            [api_client.sanitize_for_serialization(owner_reference)] if owner_reference else []
        )
        self._objects = StateConfigMaps(
            self._api, job_name, owner_references, lambda: self._lease.token
        )
        self._head_name = f"{job_name}-state"
        self._lease = KubeLease(
            self._api,
            f"{job_name}-master",
            self._kube.lease_duration_s,
            self._objects.labels,
            owner_references,
        )
        self._journal = KubeJournal(
            self._objects, self._kube.journal_chunk_bytes, self._kube.object_bytes, self._conflict
        )
        self._snapshots = KubeSnapshots(self._objects, self._kube.object_bytes)
        self._mutex = threading.Lock()  # acquire and close against each other
        self._committer: GroupCommitter | None = None
        self._closed = False
        # The writer's view (the writer thread's alone once acquired).
        self._head: Head | None = None
        #: Called with the name of each step of a write ("batch", "records", "journal",
        #: "snapshot-part", "head", "delete"): a seam for tests that simulate a crash there.
        self._on_step: Callable[[str], None] | None = None

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def job_name(self) -> str:
        return self._job

    def job_secret(self) -> str:
        """The job's secret, derived from the namespace's key (:data:`KEYS_SECRET`), the
        job's name and its owner's uid: the master may read that one Secret and no other
        (manifests/rbac.yaml names it), and the first master of the namespace makes it. So
        the masters of one namespace can derive each other's secrets: a namespace is one
        tenant."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": KEYS_SECRET,
                "labels": {MANAGED_BY_LABEL: "elastic-step"},
            },
            "type": "Opaque",
            "stringData": {"key": secrets.token_hex(32)},
        }
        made = self._api.get_or_create_secret(body)
        try:
            key = base64.b64decode((made.get("data") or {})["key"]).decode()
        except (KeyError, ValueError) as e:
            raise StateStoreError(
                f"Secret {KEYS_SECRET} in namespace {self._namespace} has no key 'key': "
                "elastic-step derives each job's secret from it (make it with "
                f"kubectl create secret generic {KEYS_SECRET} "
                '--from-literal=key="$(openssl rand -hex 32)")'
            ) from e
        if len(key) < 32:
            raise StateStoreError(
                f"Secret {KEYS_SECRET} in namespace {self._namespace}: its key has "
                f"{len(key)} characters; elastic-step wants at least 32 (random)"
            )
        # The run's object too, when there is one: a job deleted and made again under the
        # same name does not trust the tokens and certificates of the one before.
        owner = self._objects.owner_references[0]["uid"] if self._objects.owner_references else ""
        subject = f"job {self._job} {owner}".encode()
        return hmac.new(key.encode(), subject, hashlib.sha256).hexdigest()

    @property
    def takeover_wait_s(self) -> float:
        # A crashed owner's lease runs out after its duration; a little more covers skew.
        return 2 * self._kube.lease_duration_s + 5

    def describe(self) -> str:
        return (
            f"Kubernetes ConfigMaps {self._namespace}/{self._head_name}* "
            f"(lease {self._namespace}/{self._lease.name})"
        )

    # -- the lease and recovery --

    def acquire(self, owner: str, timeout_s: float) -> int:
        with self._mutex:
            if self._committer is not None or self._closed:
                raise StateStoreError(f"{self.describe()}: a store is acquired at most once")
            token = self._lease.acquire(owner, timeout_s, self._head_token)
            self._lease.start_renewing(self._fenced)
            try:
                next_seq = self._recover(token)
            except BaseException:
                self._lease.release()
                raise
            self._committer = GroupCommitter(
                f"state store {self._namespace}/{self._head_name}", self._write, next_seq
            )
            return token

    def _head_token(self) -> int:
        head = self._read_head()
        return head.token if head else 0

    def _recover(self, token: int) -> int:
        """Takes the state over from the previous owner and repairs what it left; returns the
        next record's seq."""
        head = self._take_head(token)
        if head.journal:
            # Its rv changes: the previous owner's appends to it fail from now on.
            self._journal.touch(head.journal[-1]["name"], token)
        try:
            replay = self._replay(head)
        except _Changed:
            self._lease.check()
            raise StateStoreError(
                f"{self.describe()}: the head changed while this owner took the state over"
            ) from None
        self._head = head
        chunks = replay.chunks
        if replay.cut is not None:
            chunks = self._repair(replay)
        if self._head.journal:
            self._journal.resume(self._head.journal[-1], chunks[-1])
        self._sweep()
        return replay.last_seq + 1

    def _take_head(self, token: int) -> Head:
        """Writes ``token`` into the head (creating it if there is none)."""
        for _ in range(_ATTEMPTS):
            head = self._read_head()
            if head is None:
                fresh = Head(None, token)
                try:
                    created = self._api.create_configmap(
                        self._objects.body(self._head_name, "head", {"head": fresh.text()})
                    )
                except KubeError as err:
                    if err.already_exists:
                        continue
                    raise
                fresh.rv = rv_of(created)
                return fresh
            if head.token > token:
                raise StateStoreFencedError(
                    f"{self.describe()}: the state names token {head.token}, newer than this "
                    f"owner's {token}: another owner took over; this one must stop"
                )
            taken = replace(head, token=token)
            try:
                patched = self._api.patch_configmap(
                    self._head_name,
                    {"metadata": {"resourceVersion": head.rv}, "data": {"head": taken.text()}},
                )
            except KubeError as err:
                if err.conflict:
                    continue  # the previous owner committed something meanwhile
                raise
            taken.rv = rv_of(patched)
            return taken
        raise StateStoreError(f"{self.describe()}: the head kept changing during the takeover")

    def _repair(self, replay: Replay) -> list[dict]:
        """Ends the journal at the cut; returns the chunks that remain, read."""
        cut = replay.cut
        head = self._head
        chunks = list(replay.chunks)
        keep = cut.index
        aside = []
        if cut.key is not None:
            keep += 1
            name = head.journal[cut.index]["name"]
            aside += self._set_aside_past(name, chunks[cut.index], cut)
            chunks[cut.index] = self._journal.cut_chunk(name, chunks[cut.index], cut)
        dropped = [entry["name"] for entry in head.journal[keep:]]
        for name in dropped:  # out of the sweep's reach: it deletes only state parts
            self._api.patch_configmap(name, {"metadata": {"labels": {PART_LABEL: SET_ASIDE}}})
        aside += dropped
        if dropped:
            self._commit_head(replace(head, rv=None, journal=head.journal[:keep]))
        log.warning(
            "%s: the journal ended in %s; cut it there%s. The state resumes after record %d",
            self.describe(),
            cut.problem,
            f"; set aside what followed in ConfigMap(s) {', '.join(aside)} (labelled "
            f"{PART_LABEL}={SET_ASIDE})"
            if aside
            else "",
            replay.last_seq,
        )
        return chunks[:keep]

    def _set_aside_past(self, name: str, chunk: dict, cut: Cut) -> list[str]:
        """Copies what chunk ``name`` holds past the cut into a ConfigMap labelled
        ``set-aside``, before the cut removes it; its name, or none when nothing follows."""
        data = data_of(chunk)
        rest = {key: value for key, value in data.items() if key > cut.key}
        lines = data[cut.key].split("\n")[cut.good :]
        if lines:
            rest[cut.key] = "\n".join(lines)
        if not rest:
            return []
        copy = f"{name}-set-aside-t{self._objects.token}"
        self._objects.create(copy, SET_ASIDE, rest)
        return [copy]

    def _sweep(self) -> None:
        """Deletes the snapshot parts and journal chunks the head does not name: what crashes
        left, and what a fenced owner created after the takeover (it can never commit them)."""
        named = self._head.names()
        selector = f"{JOB_LABEL}={self._job},{PART_LABEL} in (snapshot,journal)"
        for metadata in self._api.list_configmap_metadata(selector):
            if metadata["name"] not in named:
                log.info("%s: deleting %s, left over", self.describe(), metadata["name"])
                self._api.delete_configmap(metadata["name"])

    def _fenced(self, error: StateStoreFencedError) -> None:
        committer = self._committer
        if committer is not None:
            committer.fail(error)

    # -- reading --

    def load(self) -> SavedState:
        for _ in range(_ATTEMPTS):
            head = self._read_head()
            if head is None:
                return SavedState(None, [])
            try:
                replay = self._replay(head)
            except _Changed:
                continue
            return replay.saved()
        raise StateStoreError(
            f"{self.describe()} kept changing while it was read ({_ATTEMPTS} attempts); try again"
        )

    def _read_head(self) -> Head | None:
        obj = self._api.get_configmap(self._head_name)
        if obj is None:
            return None
        where = f"the state head {self._namespace}/{self._head_name}"
        document = versioned_document(data_of(obj).get("head", ""), where, HEAD_FORMAT)
        token, generation = document.get("token"), document.get("generation")
        snapshot, journal = document.get("snapshot"), document.get("journal")
        valid = (
            type(token) is int
            and type(generation) is int
            and (
                snapshot is None
                or (
                    isinstance(snapshot, dict)
                    and type(snapshot.get("seq")) is int
                    and isinstance(snapshot.get("parts"), list)
                    and all(isinstance(p, str) for p in snapshot["parts"])
                    and isinstance(snapshot.get("sha256"), str)
                )
            )
            and isinstance(journal, list)
            and all(
                isinstance(e, dict)
                and isinstance(e.get("name"), str)
                and type(e.get("first")) is int
                for e in journal
            )
        )
        if not valid:
            raise StateStoreError(f"{where} is malformed: {data_of(obj).get('head', '')[:200]}")
        return Head(rv_of(obj), token, generation, snapshot, journal)

    def _unless_changed(self, head: Head) -> None:
        current = self._api.get_configmap(self._head_name)
        if current is None or rv_of(current) != head.rv:
            raise _Changed()

    def _replay(self, head: Head) -> Replay:
        def check_head() -> None:
            self._unless_changed(head)

        snapshot, last = None, 0
        if head.snapshot:
            snapshot, last = self._snapshots.read(head.snapshot, check_head)
        read = self._journal.read(head.journal, last, check_head)
        return Replay(snapshot, last, read.records, read.last_seq, read.chunks, read.cut)

    # -- writing --

    def _step(self, name: str) -> None:
        hook = self._on_step
        if hook is not None:
            hook(name)

    def _write(self, records: list[tuple[int, dict]], snapshot: PendingSnapshot | None) -> None:
        """The writer thread's batch: records in order, then the snapshot and compaction."""
        try:
            self._step("batch")
            self._lease.ensure_valid()
            lines, error = self._journal.encode(records)
            if error is not None or snapshot is None:
                self._append(lines)
            else:
                split = next((i for i, (seq, _) in enumerate(lines) if seq > snapshot.seq), None)
                split = len(lines) if split is None else split
                self._append(lines[:split])
                self._step("records")
                self._write_snapshot(snapshot, lines[split:])
            if error is not None:
                raise error
        except StateStoreFencedError as e:
            self._lease.fence(e)  # no more renewals
            raise

    def _append(self, lines: list[tuple[int, str]]) -> None:
        if not lines:
            return
        taken = self._journal.fill(lines)
        if taken < len(lines):
            chunks = self._journal.create(lines[taken:])
            self._step("journal")
            head = self._head
            self._commit_head(
                replace(head, rv=None, journal=[*head.journal, *(c.entry() for c in chunks)])
            )
            self._journal.current = chunks[-1]

    def _write_snapshot(self, snapshot: PendingSnapshot, after: list[tuple[int, str]]) -> None:
        token = self._lease.token
        text = self._snapshots.encode(snapshot, token)
        old = self._head
        generation = old.generation + 1
        chunks = self._journal.create(after)
        self._step("journal")
        entry = self._snapshots.write(
            text, snapshot.seq, generation, lambda: self._step("snapshot-part")
        )
        new = Head(None, token, generation, entry, [chunk.entry() for chunk in chunks])
        self._lease.ensure_valid()  # again: the head is what a successor builds on
        self._commit_head(new)
        self._journal.current = chunks[-1] if chunks else None
        self._step("head")
        for name in sorted(old.names() - new.names()):
            self._api.delete_configmap(name)
            self._step("delete")

    def _commit_head(self, new: Head) -> None:
        """Replaces the head with ``new``, conditional on the head this owner last wrote."""
        text = new.text()
        try:
            patched = self._api.patch_configmap(
                self._head_name,
                {"metadata": {"resourceVersion": self._head.rv}, "data": {"head": text}},
            )
        except KubeError as err:
            if not (err.conflict or err.not_found):
                raise
            patched = self._api.get_configmap(self._head_name)
            if data_of(patched).get("head") != text:  # else: a retry whose first try had landed
                self._conflict(f"the state head {self._namespace}/{self._head_name}", err)
        new.rv = rv_of(patched)
        self._head = new

    def _conflict(self, what: str, err: KubeError) -> None:
        """A conditional write failed: raises StateStoreFencedError if another owner took over
        (the usual reason), else a StateStoreError."""
        head = self._read_head()
        token = self._lease.token
        if head is None or head.token != token:
            raise StateStoreFencedError(
                f"{self.describe()}: this owner lost the state: its token is {token}, the "
                f"job's is now {head.token if head else 'gone'} ({what} changed under it); "
                "it must stop writing"
            )
        self._lease.check()
        raise StateStoreError(
            f"{what} was changed by someone other than its owner ({err}); stopping the writer"
        )

    # -- the end --

    def _crash(self) -> None:
        """Stops as a killed process would: no more renewals or writes, nothing released, no
        flush. For tests."""
        with self._mutex:
            self._closed = True
            self._lease.stop_renewing()
            committer = self._committer
            if committer is not None:
                committer.fail(StateStoreError(f"{self.describe()}: crashed (simulated)"))
                committer.stop(self._settings.close_timeout_s)
