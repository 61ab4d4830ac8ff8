import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_KIND_UNSPECIFIED: _ClassVar[SessionKind]
    SESSION_KIND_INTERACTIVE: _ClassVar[SessionKind]
    SESSION_KIND_BATCH: _ClassVar[SessionKind]

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_QUEUED: _ClassVar[SessionState]
    SESSION_STATE_PROVISIONING: _ClassVar[SessionState]
    SESSION_STATE_PULLING_IMAGE: _ClassVar[SessionState]
    SESSION_STATE_RUNNING: _ClassVar[SessionState]
    SESSION_STATE_STOPPING: _ClassVar[SessionState]
    SESSION_STATE_STOPPED: _ClassVar[SessionState]
    SESSION_STATE_FAILED: _ClassVar[SessionState]
    SESSION_STATE_STARTING: _ClassVar[SessionState]

class StartKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    START_KIND_UNSPECIFIED: _ClassVar[StartKind]
    START_KIND_WARM: _ClassVar[StartKind]
    START_KIND_PARTIAL: _ClassVar[StartKind]
    START_KIND_COLD: _ClassVar[StartKind]

class VmState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VM_STATE_UNSPECIFIED: _ClassVar[VmState]
    VM_STATE_CREATING: _ClassVar[VmState]
    VM_STATE_BOOTING: _ClassVar[VmState]
    VM_STATE_WARM: _ClassVar[VmState]
    VM_STATE_ASSIGNED: _ClassVar[VmState]
    VM_STATE_RECYCLING: _ClassVar[VmState]
    VM_STATE_DELETING: _ClassVar[VmState]
    VM_STATE_DELETED: _ClassVar[VmState]
    VM_STATE_FAILED: _ClassVar[VmState]
    VM_STATE_STOPPING_STANDBY: _ClassVar[VmState]
    VM_STATE_STANDBY: _ClassVar[VmState]
    VM_STATE_STARTING: _ClassVar[VmState]
SESSION_KIND_UNSPECIFIED: SessionKind
SESSION_KIND_INTERACTIVE: SessionKind
SESSION_KIND_BATCH: SessionKind
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_QUEUED: SessionState
SESSION_STATE_PROVISIONING: SessionState
SESSION_STATE_PULLING_IMAGE: SessionState
SESSION_STATE_RUNNING: SessionState
SESSION_STATE_STOPPING: SessionState
SESSION_STATE_STOPPED: SessionState
SESSION_STATE_FAILED: SessionState
SESSION_STATE_STARTING: SessionState
START_KIND_UNSPECIFIED: StartKind
START_KIND_WARM: StartKind
START_KIND_PARTIAL: StartKind
START_KIND_COLD: StartKind
VM_STATE_UNSPECIFIED: VmState
VM_STATE_CREATING: VmState
VM_STATE_BOOTING: VmState
VM_STATE_WARM: VmState
VM_STATE_ASSIGNED: VmState
VM_STATE_RECYCLING: VmState
VM_STATE_DELETING: VmState
VM_STATE_DELETED: VmState
VM_STATE_FAILED: VmState
VM_STATE_STOPPING_STANDBY: VmState
VM_STATE_STANDBY: VmState
VM_STATE_STARTING: VmState

class SessionSpec(_message.Message):
    __slots__ = ("request_id", "user_id", "notebook_id", "kind", "accelerator", "image", "region_hint", "region_required", "max_runtime", "priority_class", "requeue_on_preemption")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    NOTEBOOK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    REGION_HINT_FIELD_NUMBER: _ClassVar[int]
    REGION_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    REQUEUE_ON_PREEMPTION_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    user_id: str
    notebook_id: str
    kind: SessionKind
    accelerator: str
    image: str
    region_hint: str
    region_required: bool
    max_runtime: _duration_pb2.Duration
    priority_class: str
    requeue_on_preemption: bool
    def __init__(self, request_id: _Optional[str] = ..., user_id: _Optional[str] = ..., notebook_id: _Optional[str] = ..., kind: _Optional[_Union[SessionKind, str]] = ..., accelerator: _Optional[str] = ..., image: _Optional[str] = ..., region_hint: _Optional[str] = ..., region_required: _Optional[bool] = ..., max_runtime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., priority_class: _Optional[str] = ..., requeue_on_preemption: _Optional[bool] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("state", "reason", "time")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    state: str
    reason: str
    time: _timestamp_pb2.Timestamp
    def __init__(self, state: _Optional[str] = ..., reason: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PullProgress(_message.Message):
    __slots__ = ("bytes_total", "bytes_done")
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    bytes_total: int
    bytes_done: int
    def __init__(self, bytes_total: _Optional[int] = ..., bytes_done: _Optional[int] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("id", "spec", "state", "reason", "cluster", "pool", "vm_id", "endpoint", "image", "start", "queue_position", "estimated_ready_time", "pull", "create_time", "ready_time", "end_time", "last_activity_time", "idle_timeout", "max_runtime", "history", "revision", "read_time", "notices", "budget_end_time", "priority_class", "preemption_time", "requeued_as", "requeued_from", "image_digest", "access_token")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_READY_TIME_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    READY_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVITY_TIME_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    READ_TIME_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_END_TIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_TIME_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_AS_FIELD_NUMBER: _ClassVar[int]
    REQUEUED_FROM_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    spec: SessionSpec
    state: SessionState
    reason: str
    cluster: str
    pool: str
    vm_id: str
    endpoint: str
    image: str
    start: StartKind
    queue_position: int
    estimated_ready_time: _timestamp_pb2.Timestamp
    pull: PullProgress
    create_time: _timestamp_pb2.Timestamp
    ready_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    last_activity_time: _timestamp_pb2.Timestamp
    idle_timeout: _duration_pb2.Duration
    max_runtime: _duration_pb2.Duration
    history: _containers.RepeatedCompositeFieldContainer[StateChange]
    revision: int
    read_time: _timestamp_pb2.Timestamp
    notices: _containers.RepeatedCompositeFieldContainer[Notice]
    budget_end_time: _timestamp_pb2.Timestamp
    priority_class: str
    preemption_time: _timestamp_pb2.Timestamp
    requeued_as: str
    requeued_from: str
    image_digest: str
    access_token: str
    def __init__(self, id: _Optional[str] = ..., spec: _Optional[_Union[SessionSpec, _Mapping]] = ..., state: _Optional[_Union[SessionState, str]] = ..., reason: _Optional[str] = ..., cluster: _Optional[str] = ..., pool: _Optional[str] = ..., vm_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., image: _Optional[str] = ..., start: _Optional[_Union[StartKind, str]] = ..., queue_position: _Optional[int] = ..., estimated_ready_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pull: _Optional[_Union[PullProgress, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ready_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_activity_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_runtime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., history: _Optional[_Iterable[_Union[StateChange, _Mapping]]] = ..., revision: _Optional[int] = ..., read_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., notices: _Optional[_Iterable[_Union[Notice, _Mapping]]] = ..., budget_end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority_class: _Optional[str] = ..., preemption_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., requeued_as: _Optional[str] = ..., requeued_from: _Optional[str] = ..., image_digest: _Optional[str] = ..., access_token: _Optional[str] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("kind", "message", "time", "action_time")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTION_TIME_FIELD_NUMBER: _ClassVar[int]
    kind: str
    message: str
    time: _timestamp_pb2.Timestamp
    action_time: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[str] = ..., message: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., action_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Quota(_message.Message):
    __slots__ = ("user_id", "gpu_hours_limit", "gpu_hours_used", "reset_time", "max_active_sessions", "active_sessions", "gpu_hours_left", "max_active_batch_sessions", "active_batch_sessions", "exhaustion_time")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_USED_FIELD_NUMBER: _ClassVar[int]
    RESET_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_LEFT_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTION_TIME_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    gpu_hours_limit: float
    gpu_hours_used: float
    reset_time: _timestamp_pb2.Timestamp
    max_active_sessions: int
    active_sessions: int
    gpu_hours_left: float
    max_active_batch_sessions: int
    active_batch_sessions: int
    exhaustion_time: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., gpu_hours_limit: _Optional[float] = ..., gpu_hours_used: _Optional[float] = ..., reset_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_active_sessions: _Optional[int] = ..., active_sessions: _Optional[int] = ..., gpu_hours_left: _Optional[float] = ..., max_active_batch_sessions: _Optional[int] = ..., active_batch_sessions: _Optional[int] = ..., exhaustion_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ImageCount(_message.Message):
    __slots__ = ("image", "count")
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    image: str
    count: int
    def __init__(self, image: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class PoolCapacity(_message.Message):
    __slots__ = ("pool", "accelerator", "warm_by_image", "warm", "booting", "assigned", "queued", "unhealthy", "min_vms", "max_vms", "cold_start_s", "stocked_out_zones")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    WARM_BY_IMAGE_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    BOOTING_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    MIN_VMS_FIELD_NUMBER: _ClassVar[int]
    MAX_VMS_FIELD_NUMBER: _ClassVar[int]
    COLD_START_S_FIELD_NUMBER: _ClassVar[int]
    STOCKED_OUT_ZONES_FIELD_NUMBER: _ClassVar[int]
    pool: str
    accelerator: str
    warm_by_image: _containers.RepeatedCompositeFieldContainer[ImageCount]
    warm: int
    booting: int
    assigned: int
    queued: int
    unhealthy: int
    min_vms: int
    max_vms: int
    cold_start_s: float
    stocked_out_zones: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pool: _Optional[str] = ..., accelerator: _Optional[str] = ..., warm_by_image: _Optional[_Iterable[_Union[ImageCount, _Mapping]]] = ..., warm: _Optional[int] = ..., booting: _Optional[int] = ..., assigned: _Optional[int] = ..., queued: _Optional[int] = ..., unhealthy: _Optional[int] = ..., min_vms: _Optional[int] = ..., max_vms: _Optional[int] = ..., cold_start_s: _Optional[float] = ..., stocked_out_zones: _Optional[_Iterable[str]] = ...) -> None: ...

class ClusterCapacity(_message.Message):
    __slots__ = ("cluster", "region", "healthy", "draining", "pools", "time", "project_quota")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PROJECT_QUOTA_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    region: str
    healthy: bool
    draining: bool
    pools: _containers.RepeatedCompositeFieldContainer[PoolCapacity]
    time: _timestamp_pb2.Timestamp
    project_quota: ProjectQuota
    def __init__(self, cluster: _Optional[str] = ..., region: _Optional[str] = ..., healthy: _Optional[bool] = ..., draining: _Optional[bool] = ..., pools: _Optional[_Iterable[_Union[PoolCapacity, _Mapping]]] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., project_quota: _Optional[_Union[ProjectQuota, _Mapping]] = ...) -> None: ...

class ProjectQuota(_message.Message):
    __slots__ = ("until", "metric", "cluster")
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    until: _timestamp_pb2.Timestamp
    metric: str
    cluster: str
    def __init__(self, until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., metric: _Optional[str] = ..., cluster: _Optional[str] = ...) -> None: ...

class PoolPolicy(_message.Message):
    __slots__ = ("min_vms", "max_vms", "headroom_fraction", "autoscaler", "recycle")
    MIN_VMS_FIELD_NUMBER: _ClassVar[int]
    MAX_VMS_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FRACTION_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALER_FIELD_NUMBER: _ClassVar[int]
    RECYCLE_FIELD_NUMBER: _ClassVar[int]
    min_vms: int
    max_vms: int
    headroom_fraction: float
    autoscaler: str
    recycle: bool
    def __init__(self, min_vms: _Optional[int] = ..., max_vms: _Optional[int] = ..., headroom_fraction: _Optional[float] = ..., autoscaler: _Optional[str] = ..., recycle: _Optional[bool] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("cluster", "name", "accelerator", "machine_type", "zones", "hourly_price_usd", "policy", "capacity")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    MACHINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    ZONES_FIELD_NUMBER: _ClassVar[int]
    HOURLY_PRICE_USD_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    name: str
    accelerator: str
    machine_type: str
    zones: _containers.RepeatedScalarFieldContainer[str]
    hourly_price_usd: float
    policy: PoolPolicy
    capacity: PoolCapacity
    def __init__(self, cluster: _Optional[str] = ..., name: _Optional[str] = ..., accelerator: _Optional[str] = ..., machine_type: _Optional[str] = ..., zones: _Optional[_Iterable[str]] = ..., hourly_price_usd: _Optional[float] = ..., policy: _Optional[_Union[PoolPolicy, _Mapping]] = ..., capacity: _Optional[_Union[PoolCapacity, _Mapping]] = ...) -> None: ...

class Vm(_message.Message):
    __slots__ = ("id", "cluster", "pool", "zone", "state", "reason", "images", "cache_bytes", "session_id", "healthy", "health_detail", "create_time", "history", "read_time", "spot")
    ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_DETAIL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    READ_TIME_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    id: str
    cluster: str
    pool: str
    zone: str
    state: VmState
    reason: str
    images: _containers.RepeatedScalarFieldContainer[str]
    cache_bytes: int
    session_id: str
    healthy: bool
    health_detail: str
    create_time: _timestamp_pb2.Timestamp
    history: _containers.RepeatedCompositeFieldContainer[StateChange]
    read_time: _timestamp_pb2.Timestamp
    spot: bool
    def __init__(self, id: _Optional[str] = ..., cluster: _Optional[str] = ..., pool: _Optional[str] = ..., zone: _Optional[str] = ..., state: _Optional[_Union[VmState, str]] = ..., reason: _Optional[str] = ..., images: _Optional[_Iterable[str]] = ..., cache_bytes: _Optional[int] = ..., session_id: _Optional[str] = ..., healthy: _Optional[bool] = ..., health_detail: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., history: _Optional[_Iterable[_Union[StateChange, _Mapping]]] = ..., read_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., spot: _Optional[bool] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("name", "region", "address", "healthy", "draining", "pools")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    region: str
    address: str
    healthy: bool
    draining: bool
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, name: _Optional[str] = ..., region: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., draining: _Optional[bool] = ..., pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...
