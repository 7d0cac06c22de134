"""A state store in Kubernetes objects, for a master that runs as a pod.

A new master pod of the same job (another name, another IP) takes over once the old one's
lease has run out, replays the state, and goes on; two masters of one job never both write.

Objects, all in the job's namespace, all labelled ``elastic-step/job: <job>`` and
``app.kubernetes.io/managed-by: elastic-step``, and all owned by the caller's owner reference
when one is given (deleting the owner then garbage-collects them)::

    Lease      <job>-master                               the fencing lease (kube_lease.py)
    ConfigMap  <job>-state                                the head, data {"head": JSON}
    ConfigMap  <job>-state-snapshot-<gen>-t<token>-<k>    part k of snapshot generation gen
    ConfigMap  <job>-state-journal-<first seq>-t<token>   a journal chunk

The head names everything that counts::

    {"format": 1, "token": T, "generation": G,
     "snapshot": {"seq": S, "generation": G, "parts": [names], "bytes": n, "sha256": hex} | null,
     "journal": [{"name": chunk, "first": seq}, ...]}

An object the head does not name is left over from a crash and ignored; the next owner deletes
it when it takes over. The snapshot document ``{"format": 1, "seq": S, "token": T, "state":
{...}}`` is compact ASCII JSON cut into parts of at most ``object_bytes`` (900 KiB by default:
a ConfigMap holds at most 1 MiB of data); the head keeps its SHA-256. A journal chunk holds
one data key per batch written to it: the key is the batch's first seq (20 digits, so keys
sort), the value its records, one compact JSON object a line. A chunk takes batches until it
holds ``journal_chunk_bytes``; then a new chunk starts. Names carry the creating owner's token,
so no two owners ever create the same name.

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
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client, config

from elastic_step.errors import InputError
from elastic_step.master.state_store.api import (
    SavedState,
    StateStoreError,
    StateStoreFencedError,
    StateStoreSettings,
)
from elastic_step.master.state_store.committed_store import CommittedStore
from elastic_step.master.state_store.group_commit import GroupCommitter, PendingSnapshot
from elastic_step.master.state_store.journal import encode_json
from elastic_step.master.state_store.kube_api import ApiError, KubeApi
from elastic_step.master.state_store.kube_lease import KubeLease

log = logging.getLogger("elastic_step.master.state_store")

HEAD_FORMAT = 1
SNAPSHOT_FORMAT = 1
#: The API server refuses a ConfigMap whose data exceeds this.
MAX_OBJECT_DATA = 1024 * 1024
JOB_LABEL = "elastic-step/job"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_LABEL = "elastic-step/state"  # head, snapshot or journal
TOKEN_LABEL = "elastic-step/state-token"  # the token of the owner that created it
WRITER_ANNOTATION = "elastic-step/state-writer"  # the token of the owner that appends to it
_KEY_DIGITS = 20
_ATTEMPTS = 20
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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


@dataclass
class Chunk:
    """The journal chunk the owner appends to."""

    name: str
    first: int
    rv: str
    size: int

    def entry(self) -> dict:
        return {"name": self.name, "first": self.first}


@dataclass(frozen=True)
class Cut:
    """Where the journal stops before the end of what the head names."""

    #: The index in the head's journal of the chunk it stops in.
    index: int
    #: The batch's key in that chunk; None when the chunk is missing.
    key: str | None
    #: How many records of that batch are good.
    good: int
    problem: str


@dataclass(frozen=True)
class Replay:
    snapshot: dict | None
    snapshot_seq: int
    records: list[dict]
    last_seq: int
    #: The journal chunks read, in order (up to the cut).
    chunks: list[dict]
    cut: Cut | None = None


class _Changed(Exception):
    """The owner changed the head while it was read."""


def _data(obj: dict | None) -> dict[str, str]:
    return (obj or {}).get("data") or {}


def _rv(obj: dict) -> str:
    return obj["metadata"]["resourceVersion"]


def _size(data: dict[str, str]) -> int:
    return sum(len(key) + len(value) for key, value in data.items())


def _batch(lines: list[tuple[int, str]]) -> tuple[str, str]:
    """A batch's data key (its first seq) and value (its records, a line each)."""
    return f"{lines[0][0]:0{_KEY_DIGITS}d}", "\n".join(line for _, line in lines)


def _fit(lines: list[tuple[int, str]], start: int, room: int) -> int:
    """How many lines from ``start`` fit in ``room`` bytes."""
    used = 0
    count = 0
    for _, line in lines[start:]:
        used += len(line) + 1
        if used > room:
            break
        count += 1
    return count


def default_api_client() -> client.ApiClient:
    """In a pod, its ServiceAccount; elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        # $KUBECONFIG read now: the client reads it once, when it is imported.
        return config.new_client_from_config(config_file=os.environ.get("KUBECONFIG") or None)
    except (config.ConfigException, OSError) as e:
        raise StateStoreError(
            f"the Kubernetes state store found no credentials (in-cluster or kubeconfig): {e}"
        ) from None


def default_namespace() -> str:
    """The pod's own namespace; elsewhere the kubeconfig context's, else ``default``."""
    try:
        with open(_SERVICE_ACCOUNT_NAMESPACE) as f:
            namespace = f.read().strip()
        if namespace:
            return namespace
    except OSError:
        pass
    try:
        _, context = config.list_kube_config_contexts(
            config_file=os.environ.get("KUBECONFIG") or None
        )
        return (context or {}).get("context", {}).get("namespace") or "default"
    except (config.ConfigException, OSError):
        return "default"


class KubernetesStateStore(CommittedStore):
    """The state of job ``job_name`` in ConfigMaps of ``namespace``, fenced by a Lease."""

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
        api_client = api_client or default_api_client()
        self._namespace = namespace or default_namespace()
        self._api = KubeApi(
            api_client, self._namespace, self._kube.request_timeout_s, self._kube.retry_for_s
        )
        self._owner_references = (
            [api_client.sanitize_for_serialization(owner_reference)] if owner_reference else []
        )
        self._labels = {JOB_LABEL: job_name, MANAGED_BY_LABEL: "elastic-step"}
        self._head_name = f"{job_name}-state"
        self._lease = KubeLease(
            self._api,
            f"{job_name}-master",
            self._kube.lease_duration_s,
            self._labels,
            self._owner_references,
        )
        self._mutex = threading.Lock()  # acquire and close against each other
        self._committer: GroupCommitter | None = None
        self._closed = False
        # The writer's view (the writer thread's alone once acquired).
        self._head: Head | None = None
        self._current: Chunk | None = None
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
        metadata: dict = {"name": f"{self._job}-state-secret", "labels": dict(self._labels)}
        if self._owner_references:
            metadata["ownerReferences"] = self._owner_references
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            "type": "Opaque",
            "stringData": {"secret": secrets.token_hex(32)},
        }
        secret = self._api.get_or_create_secret(body)
        return base64.b64decode(secret["data"]["secret"]).decode()

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
            self._touch(head.journal[-1]["name"], token)
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
            last, entry = chunks[-1], self._head.journal[-1]
            self._current = Chunk(entry["name"], entry["first"], _rv(last), _size(_data(last)))
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
                        self._object(self._head_name, "head", {"head": fresh.text()})
                    )
                except ApiError as err:
                    if err.already_exists:
                        continue
                    raise
                fresh.rv = _rv(created)
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
            except ApiError as err:
                if err.conflict:
                    continue  # the previous owner committed something meanwhile
                raise
            taken.rv = _rv(patched)
            return taken
        raise StateStoreError(f"{self.describe()}: the head kept changing during the takeover")

    def _touch(self, name: str, token: int) -> None:
        try:
            self._api.patch_configmap(
                name, {"metadata": {"annotations": {WRITER_ANNOTATION: str(token)}}}
            )
        except ApiError as err:
            if not err.not_found:  # missing: the replay stops there and _repair drops it
                raise

    def _repair(self, replay: Replay) -> list[dict]:
        """Ends the journal at the cut; returns the chunks that remain, read."""
        cut = replay.cut
        head = self._head
        chunks = list(replay.chunks)
        keep = cut.index
        if cut.key is not None:
            keep += 1
            chunk = chunks[cut.index]
            data = _data(chunk)
            removed: dict[str, str | None] = {key: None for key in data if key > cut.key}
            good = data[cut.key].split("\n")[: cut.good]
            removed[cut.key] = "\n".join(good) if good else None
            name = head.journal[cut.index]["name"]
            chunks[cut.index] = self._api.patch_configmap(
                name, {"metadata": {"resourceVersion": _rv(chunk)}, "data": removed}
            )
        dropped = [entry["name"] for entry in head.journal[keep:]]
        if dropped:
            self._commit_head(replace(head, rv=None, journal=head.journal[:keep]))
        log.warning(
            "%s: the journal ended in %s; cut it there%s. The state resumes after record %d",
            self.describe(),
            cut.problem,
            f" and dropped chunk(s) {', '.join(dropped)}" if dropped else "",
            replay.last_seq,
        )
        return chunks[:keep]

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
            return SavedState(replay.snapshot, replay.records)
        raise StateStoreError(
            f"{self.describe()} kept changing while it was read ({_ATTEMPTS} attempts); try again"
        )

    def _read_head(self) -> Head | None:
        obj = self._api.get_configmap(self._head_name)
        if obj is None:
            return None
        where = f"the state head {self._namespace}/{self._head_name}"
        try:
            document = json.loads(_data(obj).get("head", ""))
        except ValueError as e:
            raise StateStoreError(f"{where} is not valid JSON: {e}") from None
        if not isinstance(document, dict) or document.get("format") != HEAD_FORMAT:
            found = document.get("format") if isinstance(document, dict) else None
            raise StateStoreError(
                f"{where} has format {found!r}, this version reads format {HEAD_FORMAT}"
            )
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
            raise StateStoreError(f"{where} is malformed: {_data(obj).get('head', '')[:200]}")
        return Head(_rv(obj), token, generation, snapshot, journal)

    def _unless_changed(self, head: Head) -> None:
        current = self._api.get_configmap(self._head_name)
        if current is None or _rv(current) != head.rv:
            raise _Changed()

    def _replay(self, head: Head) -> Replay:
        snapshot, last = self._read_snapshot(head) if head.snapshot else (None, 0)
        snapshot_seq = last
        records: list[dict] = []
        chunks: list[dict] = []

        def cut(index: int, key: str | None, good: int, problem: str) -> Replay:
            return Replay(
                snapshot, snapshot_seq, records, last, chunks, Cut(index, key, good, problem)
            )

        for index, entry in enumerate(head.journal):
            name = entry["name"]
            chunk = self._api.get_configmap(name)
            if chunk is None:
                self._unless_changed(head)
                return cut(index, None, 0, f"a missing chunk, {name}")
            chunks.append(chunk)
            data = _data(chunk)
            for key in sorted(data):
                if not (len(key) == _KEY_DIGITS and key.isdigit()):
                    return cut(index, key, 0, f"a key that is not a seq, {key!r} in {name}")
                first = int(key)
                for i, line in enumerate(data[key].split("\n")):
                    seq = first + i
                    try:
                        record = json.loads(line)
                    except ValueError:
                        record = None
                    if not isinstance(record, dict):
                        return cut(
                            index, key, i, f"record {seq} that is not a JSON object in {name}"
                        )
                    if seq <= snapshot_seq and last == snapshot_seq:
                        continue  # covered by the snapshot
                    if seq != last + 1:
                        return cut(
                            index, key, i, f"record {seq} where {last + 1} was expected in {name}"
                        )
                    records.append(record)
                    last = seq
        return Replay(snapshot, snapshot_seq, records, last, chunks)

    def _read_snapshot(self, head: Head) -> tuple[dict, int]:
        entry = head.snapshot
        parts = []
        for name in entry["parts"]:
            part = self._api.get_configmap(name)
            if part is None:
                self._unless_changed(head)
                raise StateStoreError(
                    f"snapshot part {self._namespace}/{name}, named by the head, is missing"
                )
            parts.append(_data(part).get("part", ""))
        text = "".join(parts)
        where = f"snapshot generation {entry.get('generation')} ({len(parts)} part(s))"
        if hashlib.sha256(text.encode()).hexdigest() != entry["sha256"]:
            raise StateStoreError(f"{where} fails its SHA-256 check: its parts were changed")
        try:
            document = json.loads(text)
        except ValueError as e:
            raise StateStoreError(f"{where} is not valid JSON: {e}") from None
        if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
            found = document.get("format") if isinstance(document, dict) else None
            raise StateStoreError(
                f"{where} has format {found!r}, this version reads format {SNAPSHOT_FORMAT}"
            )
        seq, state = document.get("seq"), document.get("state")
        if seq != entry["seq"] or not isinstance(state, dict):
            raise StateStoreError(
                f"{where} needs seq {entry['seq']} and a state object, got seq {seq!r} "
                f"and a state of type {type(state).__name__}"
            )
        return state, seq

    # -- writing --

    def flush(self, timeout_s: float) -> None:
        committer = self._owner()
        committer.flush(timeout_s)
        try:
            self._lease.check()  # also when there was nothing to write
        except StateStoreFencedError as e:
            committer.fail(e)
            raise

    def _step(self, name: str) -> None:
        hook = self._on_step
        if hook is not None:
            hook(name)

    def _write(self, records: list[tuple[int, dict]], snapshot: PendingSnapshot | None) -> None:
        """The writer thread's batch: records in order, then the snapshot and compaction."""
        try:
            self._step("batch")
            self._lease.ensure_valid()
            lines, error = self._encode(records)
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

    def _encode(self, records: list[tuple[int, dict]]) -> tuple[list[tuple[int, str]], Any]:
        """The records as JSON lines, up to the first that cannot be written, and the error
        that one gives (None when all can)."""
        limit = self._kube.object_bytes - _KEY_DIGITS - 1
        lines = []
        for seq, record in records:
            try:
                line = encode_json(record).decode()  # ASCII: one byte a character
            except (TypeError, ValueError) as e:
                return lines, StateStoreError(f"record {seq} is not JSON-ready: {e}")
            if len(line) > limit:
                return lines, StateStoreError(
                    f"record {seq} is {len(line)} bytes as JSON; a record can be at most "
                    f"{limit} (what one ConfigMap holds)"
                )
            lines.append((seq, line))
        return lines, None

    def _append(self, lines: list[tuple[int, str]]) -> None:
        if not lines:
            return
        taken = 0
        current = self._current
        if current is not None:
            room = self._kube.journal_chunk_bytes - current.size - _KEY_DIGITS
            taken = _fit(lines, 0, room)
            if taken:
                self._patch_chunk(current, lines[:taken])
        if taken < len(lines):
            chunks = self._create_chunks(lines[taken:])
            self._step("journal")
            head = self._head
            self._commit_head(
                replace(head, rv=None, journal=[*head.journal, *(c.entry() for c in chunks)])
            )
            self._current = chunks[-1]

    def _patch_chunk(self, chunk: Chunk, lines: list[tuple[int, str]]) -> None:
        key, value = _batch(lines)
        try:
            patched = self._api.patch_configmap(
                chunk.name, {"metadata": {"resourceVersion": chunk.rv}, "data": {key: value}}
            )
        except ApiError as err:
            if not (err.conflict or err.not_found):
                raise
            patched = self._api.get_configmap(chunk.name)
            if _data(patched).get(key) != value:  # else: a retry whose first try had landed
                self._conflict(f"journal chunk {self._namespace}/{chunk.name}", err)
        chunk.rv = _rv(patched)
        chunk.size += len(key) + len(value)

    def _create_chunks(self, lines: list[tuple[int, str]]) -> list[Chunk]:
        """New journal chunks holding ``lines``, not yet named by the head."""
        chunks = []
        start = 0
        while start < len(lines):
            count = max(1, _fit(lines, start, self._kube.journal_chunk_bytes - _KEY_DIGITS))
            group = lines[start : start + count]
            key, value = _batch(group)
            first = group[0][0]
            name = f"{self._job}-state-journal-{first}-t{self._lease.token}"
            created = self._create(name, "journal", {key: value})
            chunks.append(Chunk(name, first, _rv(created), len(key) + len(value)))
            start += count
        return chunks

    def _write_snapshot(self, snapshot: PendingSnapshot, after: list[tuple[int, str]]) -> None:
        token = self._lease.token
        document = {
            "format": SNAPSHOT_FORMAT,
            "seq": snapshot.seq,
            "token": token,
            "state": snapshot.state,
        }
        try:
            text = encode_json(document).decode()  # ASCII: cutting it anywhere is safe
        except (TypeError, ValueError) as e:
            raise StateStoreError(
                f"the snapshot after record {snapshot.seq} is not JSON-ready: {e}"
            ) from e
        old = self._head
        generation = old.generation + 1
        chunks = self._create_chunks(after)
        self._step("journal")
        size = self._kube.object_bytes
        parts = []
        for k in range((len(text) + size - 1) // size):
            name = f"{self._job}-state-snapshot-{generation}-t{token}-{k}"
            piece = {"part": text[k * size : (k + 1) * size]}
            self._create(name, "snapshot", piece, immutable=True)
            parts.append(name)
            self._step("snapshot-part")
        new = Head(
            None,
            token,
            generation,
            {
                "seq": snapshot.seq,
                "generation": generation,
                "parts": parts,
                "bytes": len(text),
                "sha256": hashlib.sha256(text.encode()).hexdigest(),
            },
            [chunk.entry() for chunk in chunks],
        )
        self._lease.ensure_valid()  # again: the head is what a successor builds on
        self._commit_head(new)
        self._current = chunks[-1] if chunks else None
        self._step("head")
        for name in sorted(old.names() - new.names()):
            self._api.delete_configmap(name)
            self._step("delete")

    def _create(self, name: str, part: str, data: dict[str, str], immutable: bool = False) -> dict:
        body = self._object(name, part, data)
        if immutable:
            body["immutable"] = True
        try:
            return self._api.create_configmap(body)
        except ApiError as err:
            if not err.already_exists:
                raise
            # The name carries this owner's token: only a retried create of ours made it.
            existing = self._api.get_configmap(name)
            if existing is not None and _data(existing) == data:
                return existing
            raise StateStoreError(
                f"configmap {self._namespace}/{name} exists with other content than this "
                "owner wrote there"
            ) from None

    def _object(self, name: str, part: str, data: dict[str, str]) -> dict:
        metadata: dict = {
            "name": name,
            "labels": {**self._labels, PART_LABEL: part, TOKEN_LABEL: str(self._lease.token)},
        }
        if self._owner_references:
            metadata["ownerReferences"] = self._owner_references
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}

    def _commit_head(self, new: Head) -> None:
        """Replaces the head with ``new``, conditional on the head this owner last wrote."""
        text = new.text()
        try:
            patched = self._api.patch_configmap(
                self._head_name,
                {"metadata": {"resourceVersion": self._head.rv}, "data": {"head": text}},
            )
        except ApiError as err:
            if not (err.conflict or err.not_found):
                raise
            patched = self._api.get_configmap(self._head_name)
            if _data(patched).get("head") != text:  # else: a retry whose first try had landed
                self._conflict(f"the state head {self._namespace}/{self._head_name}", err)
        new.rv = _rv(patched)
        self._head = new

    def _conflict(self, what: str, err: ApiError) -> None:
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
