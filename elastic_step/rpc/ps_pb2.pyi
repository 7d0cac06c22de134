from elastic_step.rpc import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EmbeddingTable(_message.Message):
    __slots__ = ("name", "rows", "dim", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    rows: int
    dim: int
    dtype: str
    def __init__(self, name: _Optional[str] = ..., rows: _Optional[int] = ..., dim: _Optional[int] = ..., dtype: _Optional[str] = ...) -> None: ...

class InitializeRequest(_message.Message):
    __slots__ = ("dense", "tables", "embeddings", "model_version", "state")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    tables: _containers.RepeatedCompositeFieldContainer[EmbeddingTable]
    embeddings: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    model_version: int
    state: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[EmbeddingTable, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ..., model_version: _Optional[int] = ..., state: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class InitializeResponse(_message.Message):
    __slots__ = ("accepted", "model_version")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    model_version: int
    def __init__(self, accepted: _Optional[bool] = ..., model_version: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("dense", "tables")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    dense: bool
    tables: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    def __init__(self, dense: _Optional[bool] = ..., tables: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("initialized", "model_version", "dense", "tables")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    model_version: int
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    tables: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    def __init__(self, initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("dense", "embeddings", "model_version", "state", "pull")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    embeddings: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    model_version: int
    state: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    pull: PullRequest
    def __init__(self, dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ..., model_version: _Optional[int] = ..., state: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., pull: _Optional[_Union[PullRequest, _Mapping]] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("model_version", "pulled")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PULLED_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    pulled: PullResponse
    def __init__(self, model_version: _Optional[int] = ..., pulled: _Optional[_Union[PullResponse, _Mapping]] = ...) -> None: ...
