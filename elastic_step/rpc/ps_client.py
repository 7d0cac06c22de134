"""The client side of the PS shards, used by workers and by the master at the end of a job.

It splits a model's parameters and gradients by placement, talks to all shards in parallel,
and joins the answers. Errors come in two kinds:

- :class:`PSUnavailableError`: a shard is down or slow (``UNAVAILABLE``,
  ``DEADLINE_EXCEEDED``) or holds no parameters (it was relaunched). The caller asks the
  master for the shards' new addresses and reconnects.
- :class:`PSError`: a shard answered with any other status (a bad request, refused
  credentials, a bug in the PS). Reconnecting would get the same answer: the caller stops.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np

from elastic_step.rpc import placement, ps_pb2, ps_pb2_grpc
from elastic_step.rpc.auth import Credentials, authenticated_channel
from elastic_step.rpc.tensors import from_proto, rows_from_proto, rows_to_proto, to_proto

_MAX_MESSAGE = 512 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
]


# The statuses of a shard that is away or starting; a relaunched shard without parameters
# answers UNAVAILABLE too (see ps/server.py).
_UNAVAILABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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


class PSClient:
    def __init__(
        self, addresses: list[str], credentials: Credentials, timeout_s: float = 30.0
    ) -> None:
        self.addresses = list(addresses)
        self.num_ps = len(addresses)
        self._timeout = timeout_s
        self._channels = [
            authenticated_channel(a, credentials, options=CHANNEL_OPTIONS) for a in addresses
        ]
        self._stubs = [ps_pb2_grpc.ParameterServerStub(c) for c in self._channels]
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
            getattr(requests[shard], field).append(to_proto(name, value))

    def _call_all(self, method: str, requests: list) -> list:
        """Calls ``method`` on every shard at once; answers in shard order.

        Shard 0 is called in this thread and the others as futures: a future costs a call
        set-up that dominated a one-shard push.
        """

        def failed(shard: int, e: grpc.RpcError) -> Exception:
            if e.code() in _UNAVAILABLE:
                return PSUnavailableError(shard, f"{e.code().name}: {e.details()}")
            return PSError(shard, method, e.code(), e.details() or "")

        calls = [getattr(stub, method) for stub in self._stubs]
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
        table_values: dict[str, np.ndarray],
        model_version: int,
        state: dict[str, np.ndarray] | None = None,
    ) -> list[bool]:
        """Offers every shard its part of the parameters; returns which shards took them.

        ``state`` holds non-trainable values (BatchNorm statistics), placed like dense ones.
        """
        requests = [ps_pb2.InitializeRequest(model_version=model_version) for _ in self._stubs]
        self._place("dense", dense, requests)
        self._place("state", state or {}, requests)
        for name, spec in tables.items():
            ids = np.arange(spec.rows, dtype=np.int64)
            for shard, request in enumerate(requests):
                owned = ids[placement.shard_of_rows(ids, self.num_ps) == shard]
                request.tables.add(name=name, rows=spec.rows, dim=spec.dim, dtype=spec.dtype)
                request.embeddings.append(rows_to_proto(name, owned, table_values[name][owned]))
        return [response.accepted for response in self._call_all("Initialize", requests)]

    def pull_dense(self) -> dict[str, np.ndarray]:
        requests = [ps_pb2.PullDenseRequest()] * self.num_ps
        values = {}
        for shard, response in enumerate(self._call_all("PullDense", requests)):
            if not response.initialized:
                raise PSUnavailableError(shard, "holds no parameters")
            self.versions[shard] = response.model_version
            values |= {t.name: from_proto(t) for t in response.dense}
        return values

    def pull_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of table ``name``, in the order of ``ids``."""
        ids = np.asarray(ids, dtype=np.int64)
        owners = placement.shard_of_rows(ids, self.num_ps)
        requests = [
            ps_pb2.PullEmbeddingRowsRequest(tables=[rows_to_proto(name, ids[owners == s], None)])
            for s in range(self.num_ps)
        ]
        result = None
        for shard, response in enumerate(self._call_all("PullEmbeddingRows", requests)):
            _, values = rows_from_proto(response.tables[0])
            if result is None:
                result = np.empty((len(ids), values.shape[1]), values.dtype)
            result[owners == shard] = values
        return result

    def push(
        self,
        dense_grads: dict[str, np.ndarray],
        row_grads: dict[str, tuple[np.ndarray, np.ndarray]],
        return_parameters: bool = True,
        state: dict[str, np.ndarray] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]:
        """Pushes one step's gradients to every shard; returns the new dense values and rows.

        Every shard gets a request, even an empty one, so all shards' versions advance together.
        """
        requests = [
            ps_pb2.PushGradientsRequest(model_version=v, return_parameters=return_parameters)
            for v in self.versions
        ]
        self._place("dense", dense_grads, requests)
        self._place("state", state or {}, requests)
        for name, (ids, values) in row_grads.items():
            owners = placement.shard_of_rows(ids, self.num_ps)
            for shard, request in enumerate(requests):
                mask = owners == shard
                if mask.any():
                    request.embeddings.append(rows_to_proto(name, ids[mask], values[mask]))
        dense, rows = {}, {}
        for shard, response in enumerate(self._call_all("PushGradients", requests)):
            self.versions[shard] = response.model_version
            dense |= {t.name: from_proto(t) for t in response.dense}
            for entry in response.embeddings:
                ids, values = rows_from_proto(entry)
                if entry.name in rows:
                    old_ids, old_values = rows[entry.name]
                    ids, values = (
                        np.concatenate([old_ids, ids]),
                        np.concatenate([old_values, values]),
                    )
                rows[entry.name] = (ids, values)
        return dense, rows
