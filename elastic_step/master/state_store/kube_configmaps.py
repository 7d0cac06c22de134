"""The Kubernetes state store's ConfigMaps: how they are labelled and owned, and their create.

Every object of the store is labelled ``elastic-step/job: <job>`` and
``app.kubernetes.io/managed-by: elastic-step``, owned by the caller's owner reference when one
is given, and labelled with what it is (``elastic-step/state``: head, snapshot or journal) and
the token of the owner that created it. Snapshot parts and journal chunks carry that token in
their names, so no two owners ever create the same name, and a create that finds its name
taken was this owner's own earlier try (see :meth:`StateConfigMaps.create`). The layout of
the objects, and what the head names: kubernetes_store.py.

Tests: against an API server, tests/k8s/test_k8s_state_store.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from elastic_step.kube.calls import KubeError
from elastic_step.kube.objects import KubeObjects
from elastic_step.master.state_store.api import StateStoreError

JOB_LABEL = "elastic-step/job"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_LABEL = "elastic-step/state"  # head, snapshot, journal, or set-aside (by a repair)
TOKEN_LABEL = "elastic-step/state-token"  # the token of the owner that created it


def versioned_document(text: str, where: str, version: int) -> dict:
    """The JSON object ``text`` read from ``where``, refused in one line unless its
    ``format`` is ``version``, the one this version of elastic-step reads."""
    try:
        document = json.loads(text)
    except ValueError as e:
        raise StateStoreError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(document, dict) or document.get("format") != version:
        found = document.get("format") if isinstance(document, dict) else None
        raise StateStoreError(f"{where} has format {found!r}, this version reads format {version}")
    return document


def data_of(obj: dict | None) -> dict[str, str]:
    return (obj or {}).get("data") or {}


def rv_of(obj: dict) -> str:
    return obj["metadata"]["resourceVersion"]


def size_of(data: dict[str, str]) -> int:
    return sum(len(key) + len(value) for key, value in data.items())


class StateConfigMaps:
    """The ConfigMaps of job ``job``'s state, through ``api``. ``token()`` is the token of the
    owner that writes now (0 before it holds the lease)."""

    def __init__(
        self,
        api: KubeObjects,
        job: str,
        owner_references: list[dict],
        token: Callable[[], int],
    ) -> None:
        self.api = api
        self.job = job
        self.labels = {JOB_LABEL: job, MANAGED_BY_LABEL: "elastic-step"}
        self.owner_references = owner_references
        self._token = token

    @property
    def namespace(self) -> str:
        return self.api.namespace

    @property
    def token(self) -> int:
        return self._token()

    def body(self, name: str, part: str, data: dict[str, str]) -> dict:
        """A ConfigMap ``name`` holding ``data``: ``part`` of the state, by this owner."""
        metadata: dict = {
            "name": name,
            "labels": {**self.labels, PART_LABEL: part, TOKEN_LABEL: str(self.token)},
        }
        if self.owner_references:
            metadata["ownerReferences"] = self.owner_references
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}

    def create(self, name: str, part: str, data: dict[str, str], immutable: bool = False) -> dict:
        """Creates the ConfigMap; one that exists already with ``data`` is this owner's
        (a retried create whose first try had landed), and is returned."""
        body = self.body(name, part, data)
        if immutable:
            body["immutable"] = True
        try:
            return self.api.create_configmap(body)
        except KubeError as err:
            if not err.already_exists:
                raise
            # The name carries this owner's token: only a retried create of ours made it.
            existing = self.api.get_configmap(name)
            if existing is not None and data_of(existing) == data:
                return existing
            raise StateStoreError(
                f"configmap {self.namespace}/{name} exists with other content than this "
                "owner wrote there"
            ) from None
