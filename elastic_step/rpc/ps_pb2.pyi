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

class PullDenseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PullDenseResponse(_message.Message):
    __slots__ = ("initialized", "model_version", "dense")
    INITIALIZED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    initialized: bool
    model_version: int
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, initialized: _Optional[bool] = ..., model_version: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class PullEmbeddingRowsRequest(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    def __init__(self, tables: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ...) -> None: ...

class PullEmbeddingRowsResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    def __init__(self, tables: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ...) -> None: ...

class PushGradientsRequest(_message.Message):
    __slots__ = ("dense", "embeddings", "model_version", "return_parameters", "state")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RETURN_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    embeddings: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    model_version: int
    return_parameters: bool
    state: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    def __init__(self, dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ..., model_version: _Optional[int] = ..., return_parameters: _Optional[bool] = ..., state: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ...) -> None: ...

class PushGradientsResponse(_message.Message):
    __slots__ = ("model_version", "dense", "embeddings")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    dense: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    embeddings: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.EmbeddingRows]
    def __init__(self, model_version: _Optional[int] = ..., dense: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[_tensor_pb2.EmbeddingRows, _Mapping]]] = ...) -> None: ...
