"""Numpy arrays to and from the wire's Tensor messages, without copies where numpy allows."""

from __future__ import annotations

import numpy as np

from elastic_step.rpc import tensor_pb2


def to_proto(name: str, array: np.ndarray) -> tensor_pb2.Tensor:
    array = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
    return tensor_pb2.Tensor(
        name=name, dtype=array.dtype.name, shape=array.shape, content=array.tobytes()
    )


def from_proto(tensor: tensor_pb2.Tensor) -> np.ndarray:
    """A read-only view of the message's bytes."""
    return np.frombuffer(tensor.content, dtype=np.dtype(tensor.dtype)).reshape(tuple(tensor.shape))


def rows_to_proto(
    name: str, ids: np.ndarray, values: np.ndarray | None
) -> tensor_pb2.EmbeddingRows:
    rows = tensor_pb2.EmbeddingRows(name=name, ids=np.asarray(ids, dtype=np.int64).tolist())
    if values is not None:
        rows.values.CopyFrom(to_proto(name, values))
    return rows


def rows_from_proto(rows: tensor_pb2.EmbeddingRows) -> tuple[np.ndarray, np.ndarray | None]:
    ids = np.asarray(rows.ids, dtype=np.int64)
    values = from_proto(rows.values) if rows.HasField("values") else None
    return ids, values
