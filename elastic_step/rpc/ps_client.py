"""The client side of the PS shards, used by workers and by the master at the end of a job.

It splits a model's parameters and gradients by placement, talks to all shards in parallel,
and joins the answers. Errors come in two kinds:

- :class:`PSUnavailableError`: a shard is down or slow (``UNAVAILABLE``,
  ``DEADLINE_EXCEEDED``) or holds no parameters (it was relaunched). The caller asks the
  master for the shards' new addresses and reconnects.
- :class:`PSError`: a shard answered with any other status (a bad request, refused
  credentials, a bug in the PS). Reconnecting would get the same answer: the caller stops.

Tests: tests/unit/test_ps.py, tests/unit/test_auth.py.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import grpc
import numpy as np

from elastic_step.rpc import placement, ps_pb2
from elastic_step.rpc.auth import Credentials, authenticated_channel
from elastic_step.rpc.tensors import fill, fill_rows, from_proto, rows_from_proto

_MAX_MESSAGE = 512 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
]


# The statuses of a shard that is away, starting or stopping (a stopping server cancels the
# calls in flight); a relaunched shard without parameters answers UNAVAILABLE too (see
# ps/server.py).
_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


class PSUnavailableError(Exception):
    """A PS shard cannot be reached, or holds no parameters (it was relaunched): reconnect."""

    def __init__(self, shard: int, detail: str) -> None:
        super().__init__(f"PS shard {shard}: {detail}")
        self.shard = shard


class PSError(Exception):
    """A PS shard answered with an error that reconnecting would not cure."""

    def __init__(self, shard: int, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"PS shard {shard} rejected {method}: {code.name}: {details}")
        self.shard = shard
        self.method = method
        self.code = code
        self.details = details


@dataclass(frozen=True)
class TableSpec:
    """An embedding table: its full shape, before it is split by row id."""

    rows: int
    dim: int
    dtype: str


#: Rows of tables by name: (global row ids, values), values row i for id i.
Rows = dict[str, tuple[np.ndarray, np.ndarray]]

_METHODS = {
    "Initialize": (ps_pb2.InitializeRequest, ps_pb2.InitializeResponse),
    "Pull": (ps_pb2.PullRequest, ps_pb2.PullResponse),
    "Push": (ps_pb2.PushRequest, ps_pb2.PushResponse),
}


class Traffic:
    """Bytes of serialized messages this client sent and received, counted as gRPC encodes and
    decodes them (no extra pass), and the calls made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        self.received = 0
        self.calls = 0

    def serializer(self, message) -> bytes:
        data = message.SerializeToString()
        with self._lock:
            self.sent += len(data)
            self.calls += 1
        return data

    def deserializer(self, response_type):
        def parse(data: bytes):
            with self._lock:
                self.received += len(data)
            return response_type.FromString(data)

        return parse


class PSClient:
    def __init__(
        self,
        addresses: list[str],
        credentials: Credentials,
        timeout_s: float = 30.0,
        traffic: Traffic | None = None,
    ) -> None:
        """``traffic``: where to count bytes, e.g. one counter across a worker's connections."""
        self.addresses = list(addresses)
        self.num_ps = len(addresses)
        self._timeout = timeout_s
        self._channels = [
            authenticated_channel(a, credentials, server_role="ps", options=CHANNEL_OPTIONS)
            for a in addresses
        ]
        self.traffic = traffic or Traffic()
        self._methods = [
            {
                name: channel.unary_unary(
                    f"/elastic_step.ParameterServer/{name}",
                    request_serializer=self.traffic.serializer,
                    response_deserializer=self.traffic.deserializer(response_type),
                )
                for name, (_, response_type) in _METHODS.items()
            }
            for channel in self._channels
        ]
        #: Each shard's model version as last seen.
        self.versions = [0] * self.num_ps

    @property
    def model_version(self) -> int:
        return max(self.versions)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def _place(self, field: str, values: dict[str, np.ndarray], requests: list) -> None:
        """Adds each value to ``field`` of the request for the shard that holds its variable."""
        for name, value in values.items():
            shard = placement.shard_of_variable(name, self.num_ps)
            fill(getattr(requests[shard], field).add(), name, value)

    def _split(self, ids: np.ndarray) -> list[np.ndarray | slice]:
        """For each shard, which of ``ids`` it owns: a mask, or everything with one shard."""
        if self.num_ps == 1:
            return [slice(None)]
        owners = placement.shard_of_rows(ids, self.num_ps)
        return [owners == shard for shard in range(self.num_ps)]

    def _place_rows(self, rows: Rows, fields: list) -> None:
        """Adds each table's rows to the repeated field (one per shard) of their owner."""
        for name, (ids, values) in rows.items():
            for field, owned in zip(fields, self._split(ids), strict=True):
                part = ids[owned]
                if len(part):
                    fill_rows(field.add(), name, part, values[owned])

    def _pull_request(self, request: ps_pb2.PullRequest, ids: dict[str, np.ndarray], dense: bool):
        """Fills one pull per shard into ``request`` (a list, one per shard); returns the masks
        that put the answers back in order."""
        masks = {}
        for shard_request in request:
            shard_request.dense = dense
        for name, table_ids in ids.items():
            masks[name] = self._split(table_ids)
            for shard_request, owned in zip(request, masks[name], strict=True):
                fill_rows(shard_request.tables.add(), name, table_ids[owned], None)
        return masks

    def _join_pulled(
        self, responses: list, ids: dict[str, np.ndarray], masks: dict
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        dense, rows = {}, {}
        for shard, response in enumerate(responses):
            if not response.initialized:
                raise PSUnavailableError(shard, "holds no parameters")
            self.versions[shard] = response.model_version
            dense |= {t.name: from_proto(t) for t in response.dense}
        for i, name in enumerate(ids):
            parts = [rows_from_proto(response.tables[i])[1] for response in responses]
            if self.num_ps == 1:
                rows[name] = parts[0]
                continue
            joined = np.empty((len(ids[name]), parts[0].shape[1]), parts[0].dtype)
            for owned, part in zip(masks[name], parts, strict=True):
                joined[owned] = part
            rows[name] = joined
        return dense, rows

    def _call_all(self, method: str, requests: list) -> list:
        """Calls ``method`` on every shard at once; answers in shard order.

        Shard 0 is called in this thread and the others as futures: a future costs a call
        set-up that dominated a one-shard push.
        """

        def failed(shard: int, e: grpc.RpcError) -> Exception:
            if e.code() in _UNAVAILABLE:
                return PSUnavailableError(shard, f"{e.code().name}: {e.details()}")
            return PSError(shard, method, e.code(), e.details() or "")

        calls = [methods[method] for methods in self._methods]
        futures = [
            call.future(request, timeout=self._timeout)
            for call, request in zip(calls[1:], requests[1:], strict=True)
        ]
        try:
            first = calls[0](requests[0], timeout=self._timeout)
        except grpc.RpcError as e:
            raise failed(0, e) from e
        results = [first]
        for shard, future in enumerate(futures, start=1):
            try:
                results.append(future.result())
            except grpc.RpcError as e:
                raise failed(shard, e) from e
        return results

    def initialize(
        self,
        dense: dict[str, np.ndarray],
        tables: dict[str, TableSpec],
        rows: Rows,
        model_version: int,
        state: dict[str, np.ndarray] | None = None,
    ) -> list[bool]:
        """Offers every shard its dense values, the tables' shapes and the table ``rows`` this
        worker has pulled; returns which shards took them. A shard starts every other row
        from the model's initializers.

        ``state`` holds non-trainable values (BatchNorm statistics), placed like dense ones.
        """
        requests = [ps_pb2.InitializeRequest(model_version=model_version) for _ in self._methods]
        self._place("dense", dense, requests)
        self._place("state", state or {}, requests)
        for name, spec in tables.items():
            for request in requests:
                request.tables.add(name=name, rows=spec.rows, dim=spec.dim, dtype=spec.dtype)
        self._place_rows(rows, [r.embeddings for r in requests])
        return [response.accepted for response in self._call_all("Initialize", requests)]

    def initialized(self) -> list[bool]:
        """Which shards hold parameters (a relaunched one without a checkpoint does not)."""
        requests = [ps_pb2.PullRequest() for _ in self._methods]
        return [response.initialized for response in self._call_all("Pull", requests)]

    def pull(
        self, ids: dict[str, np.ndarray] | None = None, dense: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The dense values (if ``dense``) and, for each table in ``ids``, the rows of those
        ids in their order."""
        ids = {n: np.asarray(i, dtype=np.int64) for n, i in (ids or {}).items()}
        requests = [ps_pb2.PullRequest() for _ in self._methods]
        masks = self._pull_request(requests, ids, dense)
        return self._join_pulled(self._call_all("Pull", requests), ids, masks)

    def push(
        self,
        dense_update: dict[str, np.ndarray],
        row_update: Rows,
        state: dict[str, np.ndarray] | None = None,
        pull_ids: dict[str, np.ndarray] | None = None,
        pull_dense: bool = True,
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Pushes one update (each table's row ids unique) to every shard, and answers with
        the pull of ``pull_ids`` and the dense values after it, as :meth:`pull` does.

        Every shard gets a request, even an empty one, so all shards' versions advance together.
        """
        pull_ids = {n: np.asarray(i, dtype=np.int64) for n, i in (pull_ids or {}).items()}
        requests = [ps_pb2.PushRequest(model_version=v) for v in self.versions]
        self._place("dense", dense_update, requests)
        self._place("state", state or {}, requests)
        self._place_rows(row_update, [r.embeddings for r in requests])
        masks = self._pull_request([r.pull for r in requests], pull_ids, pull_dense)
        responses = self._call_all("Push", requests)
        return self._join_pulled([r.pulled for r in responses], pull_ids, masks)
