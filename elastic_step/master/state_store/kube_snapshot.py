"""The Kubernetes state store's snapshots: a state cut into immutable ConfigMap parts.

The snapshot document ``{"format": 1, "seq": S, "token": T, "state": {...}}`` is compact
ASCII JSON cut into parts of at most ``object_bytes`` (900 KiB by default: a ConfigMap
holds at most 1 MiB of data), each ConfigMap ``<job>-state-snapshot-<gen>-t<token>-<k>``
holding part k under the key ``part``. The head names the parts and keeps the document's
size and SHA-256, which a read checks; the head's update is what makes a snapshot count
(kubernetes_store.py).

Tests: against an API server, tests/k8s/test_k8s_state_store.py (a snapshot larger than one
object, a crash at each step of a snapshot).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from elastic_step.master.state_store.api import StateStoreError
from elastic_step.master.state_store.group_commit import PendingSnapshot
from elastic_step.master.state_store.journal import encode_json
from elastic_step.master.state_store.kube_configmaps import (
    StateConfigMaps,
    data_of,
    versioned_document,
)

SNAPSHOT_FORMAT = 1


class KubeSnapshots:
    """The snapshot parts of one store, of at most ``part_bytes`` each."""

    def __init__(self, objects: StateConfigMaps, part_bytes: int) -> None:
        self._objects = objects
        self._part_bytes = part_bytes

    @staticmethod
    def encode(snapshot: PendingSnapshot, token: int) -> str:
        """The snapshot's document, as written by the owner with ``token``."""
        document = {
            "format": SNAPSHOT_FORMAT,
            "seq": snapshot.seq,
            "token": token,
            "state": snapshot.state,
        }
        try:
            return encode_json(document).decode()  # ASCII: cutting it anywhere is safe
        except (TypeError, ValueError) as e:
            raise StateStoreError(
                f"the snapshot after record {snapshot.seq} is not JSON-ready: {e}"
            ) from e

    def write(self, text: str, seq: int, generation: int, after_part: Callable[[], None]) -> dict:
        """Creates the parts of the document ``text`` (covering records up to ``seq``) under
        ``generation``, calling ``after_part()`` after each; the head's entry for them."""
        size = self._part_bytes
        token = self._objects.token
        parts = []
        for k in range((len(text) + size - 1) // size):
            name = f"{self._objects.job}-state-snapshot-{generation}-t{token}-{k}"
            piece = {"part": text[k * size : (k + 1) * size]}
            self._objects.create(name, "snapshot", piece, immutable=True)
            parts.append(name)
            after_part()
        return {
            "seq": seq,
            "generation": generation,
            "parts": parts,
            "bytes": len(text),
            "sha256": hashlib.sha256(text.encode()).hexdigest(),
        }

    def read(self, entry: dict, check_head: Callable[[], None]) -> tuple[dict, int]:
        """The state and seq of the snapshot the head's ``entry`` names. ``check_head()`` is
        called when a part is missing: it raises if the head changed meanwhile."""
        parts = []
        for name in entry["parts"]:
            part = self._objects.api.get_configmap(name)
            if part is None:
                check_head()
                raise StateStoreError(
                    f"snapshot part {self._objects.namespace}/{name}, named by the head, is missing"
                )
            parts.append(data_of(part).get("part", ""))
        text = "".join(parts)
        where = f"snapshot generation {entry.get('generation')} ({len(parts)} part(s))"
        if hashlib.sha256(text.encode()).hexdigest() != entry["sha256"]:
            raise StateStoreError(f"{where} fails its SHA-256 check: its parts were changed")
        document = versioned_document(text, where, SNAPSHOT_FORMAT)
        seq, state = document.get("seq"), document.get("state")
        if seq != entry["seq"] or not isinstance(state, dict):
            raise StateStoreError(
                f"{where} needs seq {entry['seq']} and a state object, got seq {seq!r} "
                f"and a state of type {type(state).__name__}"
            )
        return state, seq
