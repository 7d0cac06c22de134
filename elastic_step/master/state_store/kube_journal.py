"""The Kubernetes state store's journal: records in ConfigMap chunks.

A chunk ``<job>-state-journal-<first seq>-t<token>`` holds one data key per batch written to
it: the key is the batch's first seq (20 digits, so keys sort), the value its records, one
compact JSON object a line. The owner appends a batch to the last chunk the head names with
one patch, conditional on that chunk's resourceVersion; a chunk takes batches until it holds
``journal_chunk_bytes``, then new chunks are created, which count only once the head names
them (kubernetes_store.py commits the head). A new owner annotates the last chunk before it
reads the state, so that the previous owner's appends to it fail from then on.

Reading follows the head's chunks in order and stops at the first thing that is not the
next record (a missing chunk, a key that is not a seq, a line that is not a JSON object, a
gap): that is the journal's :class:`Cut`, where the next owner ends it.

Tests: against an API server, tests/k8s/test_k8s_state_store.py (chunks rolling over, a
damaged record, a crash at each step of a write).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastic_step.kube.calls import KubeError
from elastic_step.master.state_store.api import StateStoreError
from elastic_step.master.state_store.journal import encode_json
from elastic_step.master.state_store.kube_configmaps import (
    StateConfigMaps,
    data_of,
    rv_of,
    size_of,
)

WRITER_ANNOTATION = "elastic-step/state-writer"  # the token of the owner that appends to it
KEY_DIGITS = 20


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
class JournalRead:
    #: The records after the snapshot, in order, up to the cut.
    records: list[dict]
    last_seq: int
    #: The journal chunks read, in order (up to the cut).
    chunks: list[dict]
    cut: Cut | None = None


def _batch(lines: list[tuple[int, str]]) -> tuple[str, str]:
    """A batch's data key (its first seq) and value (its records, a line each)."""
    return f"{lines[0][0]:0{KEY_DIGITS}d}", "\n".join(line for _, line in lines)


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


class KubeJournal:
    """The journal chunks of one store. ``on_conflict(what, err)`` raises for a conditional
    write that failed (the store tells a takeover from other changes)."""

    def __init__(
        self,
        objects: StateConfigMaps,
        chunk_bytes: int,
        object_bytes: int,
        on_conflict: Callable[[str, KubeError], None],
    ) -> None:
        self._objects = objects
        self._api = objects.api
        self._chunk_bytes = chunk_bytes
        self._object_bytes = object_bytes
        self._on_conflict = on_conflict
        #: The chunk the owner appends to (the writer thread's alone once acquired).
        self.current: Chunk | None = None

    # -- reading --

    def read(
        self, entries: list[dict], snapshot_seq: int, check_head: Callable[[], None]
    ) -> JournalRead:
        """The records after ``snapshot_seq`` in the chunks ``entries`` (the head's journal).
        ``check_head()`` is called when a chunk is missing: it raises if the head changed."""
        last = snapshot_seq
        records: list[dict] = []
        chunks: list[dict] = []

        def cut(index: int, key: str | None, good: int, problem: str) -> JournalRead:
            return JournalRead(records, last, chunks, Cut(index, key, good, problem))

        for index, entry in enumerate(entries):
            name = entry["name"]
            chunk = self._api.get_configmap(name)
            if chunk is None:
                check_head()
                return cut(index, None, 0, f"a missing chunk, {name}")
            chunks.append(chunk)
            data = data_of(chunk)
            for key in sorted(data):
                if not (len(key) == KEY_DIGITS and key.isdigit()):
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
        return JournalRead(records, last, chunks)

    # -- taking over --

    def touch(self, name: str, token: int) -> None:
        """Changes chunk ``name``'s resourceVersion: the previous owner's appends fail."""
        try:
            self._api.patch_configmap(
                name, {"metadata": {"annotations": {WRITER_ANNOTATION: str(token)}}}
            )
        except KubeError as err:
            if not err.not_found:  # missing: the replay stops there and the repair drops it
                raise

    def cut_chunk(self, name: str, chunk: dict, cut: Cut) -> dict:
        """Ends chunk ``name`` (read as ``chunk``) at the cut's record; the chunk as patched."""
        data = data_of(chunk)
        removed: dict[str, str | None] = {key: None for key in data if key > cut.key}
        good = data[cut.key].split("\n")[: cut.good]
        removed[cut.key] = "\n".join(good) if good else None
        return self._api.patch_configmap(
            name, {"metadata": {"resourceVersion": rv_of(chunk)}, "data": removed}
        )

    def resume(self, entry: dict, chunk: dict) -> None:
        """Appends from now on to the chunk of the head's last ``entry``, read as ``chunk``."""
        self.current = Chunk(entry["name"], entry["first"], rv_of(chunk), size_of(data_of(chunk)))

    # -- writing --

    def encode(self, records: list[tuple[int, dict]]) -> tuple[list[tuple[int, str]], Any]:
        """The records as JSON lines, up to the first that cannot be written, and the error
        that one gives (None when all can)."""
        limit = self._object_bytes - KEY_DIGITS - 1
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

    def fill(self, lines: list[tuple[int, str]]) -> int:
        """Appends to the current chunk as many of ``lines`` as fit in it; how many."""
        current = self.current
        if current is None:
            return 0
        room = self._chunk_bytes - current.size - KEY_DIGITS
        taken = _fit(lines, 0, room)
        if taken:
            self._patch_chunk(current, lines[:taken])
        return taken

    def _patch_chunk(self, chunk: Chunk, lines: list[tuple[int, str]]) -> None:
        key, value = _batch(lines)
        try:
            patched = self._api.patch_configmap(
                chunk.name, {"metadata": {"resourceVersion": chunk.rv}, "data": {key: value}}
            )
        except KubeError as err:
            if not (err.conflict or err.not_found):
                raise
            patched = self._api.get_configmap(chunk.name)
            if data_of(patched).get(key) != value:  # else: a retry whose first try had landed
                self._on_conflict(f"journal chunk {self._objects.namespace}/{chunk.name}", err)
        chunk.rv = rv_of(patched)
        chunk.size += len(key) + len(value)

    def create(self, lines: list[tuple[int, str]]) -> list[Chunk]:
        """New journal chunks holding ``lines``, not yet named by the head."""
        chunks = []
        start = 0
        while start < len(lines):
            count = max(1, _fit(lines, start, self._chunk_bytes - KEY_DIGITS))
            group = lines[start : start + count]
            key, value = _batch(group)
            first = group[0][0]
            name = f"{self._objects.job}-state-journal-{first}-t{self._objects.token}"
            created = self._objects.create(name, "journal", {key: value})
            chunks.append(Chunk(name, first, rv_of(created), len(key) + len(value)))
            start += count
        return chunks
