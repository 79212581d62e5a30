from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT16: DType
BFLOAT16: DType
FLOAT64: DType
INT32: DType
INT64: DType

class TensorChunk(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorChunks(_message.Message):
    __slots__ = ("chunks",)
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[TensorChunk]
    def __init__(self, chunks: _Optional[_Iterable[_Union[TensorChunk, _Mapping]]] = ...) -> None: ...

class SharedTensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    length: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class SparseTensor(_message.Message):
    __slots__ = ("name", "num_ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_ids: int
    def __init__(self, name: _Optional[str] = ..., num_ids: _Optional[int] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("worker_rank", "step", "num_examples", "loss", "num_tensors", "skip_step", "segment", "shared", "pull", "sparse")
    WORKER_RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    SKIP_STEP_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    worker_rank: int
    step: int
    num_examples: int
    loss: float
    num_tensors: int
    skip_step: bool
    segment: str
    shared: _containers.RepeatedCompositeFieldContainer[SharedTensor]
    pull: PullRequest
    sparse: _containers.RepeatedCompositeFieldContainer[SparseTensor]
    def __init__(self, worker_rank: _Optional[int] = ..., step: _Optional[int] = ..., num_examples: _Optional[int] = ..., loss: _Optional[float] = ..., num_tensors: _Optional[int] = ..., skip_step: _Optional[bool] = ..., segment: _Optional[str] = ..., shared: _Optional[_Iterable[_Union[SharedTensor, _Mapping]]] = ..., pull: _Optional[_Union[PullRequest, _Mapping]] = ..., sparse: _Optional[_Iterable[_Union[SparseTensor, _Mapping]]] = ...) -> None: ...

class PushRequest(_message.Message):
    __slots__ = ("header", "chunks")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    chunks: TensorChunks
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., chunks: _Optional[_Union[TensorChunks, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("outcome", "version")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        OUTCOME_UNSPECIFIED: _ClassVar[PushReply.Outcome]
        BUFFERED: _ClassVar[PushReply.Outcome]
        APPLIED: _ClassVar[PushReply.Outcome]
        DUPLICATE: _ClassVar[PushReply.Outcome]
        ALREADY_APPLIED: _ClassVar[PushReply.Outcome]
        DROPPED: _ClassVar[PushReply.Outcome]
    OUTCOME_UNSPECIFIED: PushReply.Outcome
    BUFFERED: PushReply.Outcome
    APPLIED: PushReply.Outcome
    DUPLICATE: PushReply.Outcome
    ALREADY_APPLIED: PushReply.Outcome
    DROPPED: PushReply.Outcome
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    outcome: PushReply.Outcome
    version: int
    def __init__(self, outcome: _Optional[_Union[PushReply.Outcome, str]] = ..., version: _Optional[int] = ...) -> None: ...

class RowRequest(_message.Message):
    __slots__ = ("name", "ids")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("min_version", "timeout_s", "wire_dtype", "segment", "rows")
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    WIRE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    min_version: int
    timeout_s: float
    wire_dtype: DType
    segment: str
    rows: _containers.RepeatedCompositeFieldContainer[RowRequest]
    def __init__(self, min_version: _Optional[int] = ..., timeout_s: _Optional[float] = ..., wire_dtype: _Optional[_Union[DType, str]] = ..., segment: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[RowRequest, _Mapping]]] = ...) -> None: ...

class PullHeader(_message.Message):
    __slots__ = ("version", "num_tensors", "shared", "push")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TENSORS_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    version: int
    num_tensors: int
    shared: _containers.RepeatedCompositeFieldContainer[SharedTensor]
    push: PushReply
    def __init__(self, version: _Optional[int] = ..., num_tensors: _Optional[int] = ..., shared: _Optional[_Iterable[_Union[SharedTensor, _Mapping]]] = ..., push: _Optional[_Union[PushReply, _Mapping]] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("header", "chunks")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    header: PullHeader
    chunks: TensorChunks
    def __init__(self, header: _Optional[_Union[PullHeader, _Mapping]] = ..., chunks: _Optional[_Union[TensorChunks, _Mapping]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("since_version",)
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    since_version: int
    def __init__(self, since_version: _Optional[int] = ...) -> None: ...

class StepRecord(_message.Message):
    __slots__ = ("version", "loss", "num_examples", "applied_at_s", "staleness")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_AT_S_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    version: int
    loss: float
    num_examples: int
    applied_at_s: float
    staleness: int
    def __init__(self, version: _Optional[int] = ..., loss: _Optional[float] = ..., num_examples: _Optional[int] = ..., applied_at_s: _Optional[float] = ..., staleness: _Optional[int] = ...) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("shard_index", "version", "num_parameters", "parameter_bytes", "pushes_applied", "pushes_duplicate", "pushes_rejected", "steps", "pushes_dropped", "pushes_after_end", "gate_waits", "staleness_histogram", "pushes_nonfinite", "steps_skipped", "calls_in_flight", "bytes_received", "bytes_sent", "updates_applied", "apply_s", "pulls_waiting", "pushes_per_s", "refused_unauthenticated", "refused_permission_denied", "refused_overloaded", "refused_bad_tensor", "table_rows_touched", "table_rows_served")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PARAMETER_BYTES_FIELD_NUMBER: _ClassVar[int]
    PUSHES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    PUSHES_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    PUSHES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    PUSHES_AFTER_END_FIELD_NUMBER: _ClassVar[int]
    GATE_WAITS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    PUSHES_NONFINITE_FIELD_NUMBER: _ClassVar[int]
    STEPS_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CALLS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    UPDATES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    APPLY_S_FIELD_NUMBER: _ClassVar[int]
    PULLS_WAITING_FIELD_NUMBER: _ClassVar[int]
    PUSHES_PER_S_FIELD_NUMBER: _ClassVar[int]
    REFUSED_UNAUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_PERMISSION_DENIED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_OVERLOADED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BAD_TENSOR_FIELD_NUMBER: _ClassVar[int]
    TABLE_ROWS_TOUCHED_FIELD_NUMBER: _ClassVar[int]
    TABLE_ROWS_SERVED_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    version: int
    num_parameters: int
    parameter_bytes: int
    pushes_applied: int
    pushes_duplicate: int
    pushes_rejected: int
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    pushes_dropped: int
    pushes_after_end: int
    gate_waits: int
    staleness_histogram: _containers.RepeatedScalarFieldContainer[int]
    pushes_nonfinite: int
    steps_skipped: int
    calls_in_flight: int
    bytes_received: int
    bytes_sent: int
    updates_applied: int
    apply_s: float
    pulls_waiting: int
    pushes_per_s: float
    refused_unauthenticated: int
    refused_permission_denied: int
    refused_overloaded: int
    refused_bad_tensor: int
    table_rows_touched: int
    table_rows_served: int
    def __init__(self, shard_index: _Optional[int] = ..., version: _Optional[int] = ..., num_parameters: _Optional[int] = ..., parameter_bytes: _Optional[int] = ..., pushes_applied: _Optional[int] = ..., pushes_duplicate: _Optional[int] = ..., pushes_rejected: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ..., pushes_dropped: _Optional[int] = ..., pushes_after_end: _Optional[int] = ..., gate_waits: _Optional[int] = ..., staleness_histogram: _Optional[_Iterable[int]] = ..., pushes_nonfinite: _Optional[int] = ..., steps_skipped: _Optional[int] = ..., calls_in_flight: _Optional[int] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., updates_applied: _Optional[int] = ..., apply_s: _Optional[float] = ..., pulls_waiting: _Optional[int] = ..., pushes_per_s: _Optional[float] = ..., refused_unauthenticated: _Optional[int] = ..., refused_permission_denied: _Optional[int] = ..., refused_overloaded: _Optional[int] = ..., refused_bad_tensor: _Optional[int] = ..., table_rows_touched: _Optional[int] = ..., table_rows_served: _Optional[int] = ...) -> None: ...
