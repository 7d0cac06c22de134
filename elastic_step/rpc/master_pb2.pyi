from elastic_step.rpc import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    WORKER: _ClassVar[Role]
    PS: _ClassVar[Role]
ROLE_UNSPECIFIED: Role
WORKER: Role
PS: Role

class RegisterRequest(_message.Message):
    __slots__ = ("role", "name", "shard", "address", "pid", "waiting_for_slot")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_SLOT_FIELD_NUMBER: _ClassVar[int]
    role: Role
    name: str
    shard: int
    address: str
    pid: int
    waiting_for_slot: bool
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., name: _Optional[str] = ..., shard: _Optional[int] = ..., address: _Optional[str] = ..., pid: _Optional[int] = ..., waiting_for_slot: _Optional[bool] = ...) -> None: ...

class JobSettings(_message.Message):
    __slots__ = ("model_def", "data_dir", "output_dir", "batch_size", "num_ps", "seed", "checkpoint_steps", "keep_checkpoints", "staleness_modulation", "master_timeout_s", "local_steps", "outer_optimizer", "predict_model_dir", "predict_parts_dir", "model_def_sha256", "fencing_token")
    MODEL_DEF_FIELD_NUMBER: _ClassVar[int]
    DATA_DIR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DIR_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEPS_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MODULATION_FIELD_NUMBER: _ClassVar[int]
    MASTER_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    OUTER_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PREDICT_MODEL_DIR_FIELD_NUMBER: _ClassVar[int]
    PREDICT_PARTS_DIR_FIELD_NUMBER: _ClassVar[int]
    MODEL_DEF_SHA256_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    model_def: str
    data_dir: str
    output_dir: str
    batch_size: int
    num_ps: int
    seed: int
    checkpoint_steps: int
    keep_checkpoints: int
    staleness_modulation: bool
    master_timeout_s: float
    local_steps: int
    outer_optimizer: str
    predict_model_dir: str
    predict_parts_dir: str
    model_def_sha256: str
    fencing_token: int
    def __init__(self, model_def: _Optional[str] = ..., data_dir: _Optional[str] = ..., output_dir: _Optional[str] = ..., batch_size: _Optional[int] = ..., num_ps: _Optional[int] = ..., seed: _Optional[int] = ..., checkpoint_steps: _Optional[int] = ..., keep_checkpoints: _Optional[int] = ..., staleness_modulation: _Optional[bool] = ..., master_timeout_s: _Optional[float] = ..., local_steps: _Optional[int] = ..., outer_optimizer: _Optional[str] = ..., predict_model_dir: _Optional[str] = ..., predict_parts_dir: _Optional[str] = ..., model_def_sha256: _Optional[str] = ..., fencing_token: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("settings", "model_version", "standby")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STANDBY_FIELD_NUMBER: _ClassVar[int]
    settings: JobSettings
    model_version: int
    standby: bool
    def __init__(self, settings: _Optional[_Union[JobSettings, _Mapping]] = ..., model_version: _Optional[int] = ..., standby: _Optional[bool] = ...) -> None: ...

class GetPSAddressesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPSAddressesResponse(_message.Message):
    __slots__ = ("ready", "addresses")
    READY_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ready: _Optional[bool] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class NextTaskRequest(_message.Message):
    __slots__ = ("worker", "report", "held_leases", "report_only")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    HELD_LEASES_FIELD_NUMBER: _ClassVar[int]
    REPORT_ONLY_FIELD_NUMBER: _ClassVar[int]
    worker: str
    report: TaskReport
    held_leases: _containers.RepeatedScalarFieldContainer[int]
    report_only: bool
    def __init__(self, worker: _Optional[str] = ..., report: _Optional[_Union[TaskReport, _Mapping]] = ..., held_leases: _Optional[_Iterable[int]] = ..., report_only: _Optional[bool] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("kind", "id", "shard", "start", "end", "epoch", "lease_id", "first_index", "weights", "permuted")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Task.Kind]
        TRAIN: _ClassVar[Task.Kind]
        EVALUATE: _ClassVar[Task.Kind]
        WAIT: _ClassVar[Task.Kind]
        FINISHED: _ClassVar[Task.Kind]
        PREDICT: _ClassVar[Task.Kind]
        SAVE_MODEL: _ClassVar[Task.Kind]
    KIND_UNSPECIFIED: Task.Kind
    TRAIN: Task.Kind
    EVALUATE: Task.Kind
    WAIT: Task.Kind
    FINISHED: Task.Kind
    PREDICT: Task.Kind
    SAVE_MODEL: Task.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    PERMUTED_FIELD_NUMBER: _ClassVar[int]
    kind: Task.Kind
    id: int
    shard: str
    start: int
    end: int
    epoch: int
    lease_id: int
    first_index: int
    weights: str
    permuted: bool
    def __init__(self, kind: _Optional[_Union[Task.Kind, str]] = ..., id: _Optional[int] = ..., shard: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., epoch: _Optional[int] = ..., lease_id: _Optional[int] = ..., first_index: _Optional[int] = ..., weights: _Optional[str] = ..., permuted: _Optional[bool] = ...) -> None: ...

class TaskReport(_message.Message):
    __slots__ = ("task_id", "ok", "error", "model_version", "loss_sum", "example_count", "metric_states", "lease_id", "train_loss", "train_examples", "train_metrics")
    class TrainMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    METRIC_STATES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_METRICS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    ok: bool
    error: str
    model_version: int
    loss_sum: float
    example_count: int
    metric_states: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.Tensor]
    lease_id: int
    train_loss: float
    train_examples: int
    train_metrics: _containers.ScalarMap[str, float]
    def __init__(self, task_id: _Optional[int] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., model_version: _Optional[int] = ..., loss_sum: _Optional[float] = ..., example_count: _Optional[int] = ..., metric_states: _Optional[_Iterable[_Union[_tensor_pb2.Tensor, _Mapping]]] = ..., lease_id: _Optional[int] = ..., train_loss: _Optional[float] = ..., train_examples: _Optional[int] = ..., train_metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("name", "model_version", "lease_id", "batches_done", "failure")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCHES_DONE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    model_version: int
    lease_id: int
    batches_done: int
    failure: str
    def __init__(self, name: _Optional[str] = ..., model_version: _Optional[int] = ..., lease_id: _Optional[int] = ..., batches_done: _Optional[int] = ..., failure: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("finished", "token")
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    finished: bool
    token: str
    def __init__(self, finished: _Optional[bool] = ..., token: _Optional[str] = ...) -> None: ...
