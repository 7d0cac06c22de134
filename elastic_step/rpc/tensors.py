"""Numpy arrays to and from the wire's messages: raw bytes, one copy each way at most.

Row ids travel as packed int64 bytes, not as a repeated field, which costs a Python object
per id to build and to read.
Tests: tests/unit/test_ps.py (every pull and push over gRPC goes through it).
"""

from __future__ import annotations

import numpy as np

from elastic_step.rpc import tensor_pb2

_IDS = np.dtype("<i8")


def to_proto(name: str, array: np.ndarray) -> tensor_pb2.Tensor:
    tensor = tensor_pb2.Tensor()
    fill(tensor, name, array)
    return tensor


def fill(tensor: tensor_pb2.Tensor, name: str, array: np.ndarray) -> None:
    """Writes ``array`` into a message in place. Give it a repeated field's ``add()``:
    appending a message built apart copies it, which took 0.47 ms for a push of 300 KB in
    six tensors, against 0.03 ms filled in place."""
    array = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
    tensor.name, tensor.dtype = name, array.dtype.name
    tensor.shape[:] = array.shape
    tensor.content = array.tobytes()


def from_proto(tensor: tensor_pb2.Tensor) -> np.ndarray:
    """A read-only view of the message's bytes."""
    return np.frombuffer(tensor.content, dtype=np.dtype(tensor.dtype)).reshape(tuple(tensor.shape))


def fill_rows(
    rows: tensor_pb2.EmbeddingRows, name: str, ids: np.ndarray, values: np.ndarray | None
) -> None:
    """Writes a table's row ids, and their values if given, into a message in place (see
    :func:`fill`)."""
    rows.name, rows.ids = name, np.asarray(ids, dtype=_IDS).tobytes()
    if values is not None:
        fill(rows.values, name, values)


def rows_from_proto(rows: tensor_pb2.EmbeddingRows) -> tuple[np.ndarray, np.ndarray | None]:
    """The ids and values as read-only views of the message's bytes (values None if absent)."""
    ids = np.frombuffer(rows.ids, dtype=_IDS)
    values = from_proto(rows.values) if rows.HasField("values") else None
    return ids, values
