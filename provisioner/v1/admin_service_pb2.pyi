import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from provisioner.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListClustersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListClustersResponse(_message.Message):
    __slots__ = ("clusters",)
    CLUSTERS_FIELD_NUMBER: _ClassVar[int]
    clusters: _containers.RepeatedCompositeFieldContainer[_types_pb2.Cluster]
    def __init__(self, clusters: _Optional[_Iterable[_Union[_types_pb2.Cluster, _Mapping]]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[_types_pb2.Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[_types_pb2.Pool, _Mapping]]] = ...) -> None: ...

class DrainClusterRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class DrainClusterResponse(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: _types_pb2.Cluster
    def __init__(self, cluster: _Optional[_Union[_types_pb2.Cluster, _Mapping]] = ...) -> None: ...

class UndrainClusterRequest(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    def __init__(self, cluster: _Optional[str] = ...) -> None: ...

class UndrainClusterResponse(_message.Message):
    __slots__ = ("cluster",)
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    cluster: _types_pb2.Cluster
    def __init__(self, cluster: _Optional[_Union[_types_pb2.Cluster, _Mapping]] = ...) -> None: ...

class SetPoolPolicyRequest(_message.Message):
    __slots__ = ("cluster", "pool", "policy", "reset")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    pool: str
    policy: _types_pb2.PoolPolicy
    reset: bool
    def __init__(self, cluster: _Optional[str] = ..., pool: _Optional[str] = ..., policy: _Optional[_Union[_types_pb2.PoolPolicy, _Mapping]] = ..., reset: _Optional[bool] = ...) -> None: ...

class SetPoolPolicyResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _types_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_types_pb2.Pool, _Mapping]] = ...) -> None: ...

class PrewarmImageRequest(_message.Message):
    __slots__ = ("cluster", "pool", "image", "count")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    pool: str
    image: str
    count: int
    def __init__(self, cluster: _Optional[str] = ..., pool: _Optional[str] = ..., image: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class PrewarmImageResponse(_message.Message):
    __slots__ = ("vm_ids",)
    VM_IDS_FIELD_NUMBER: _ClassVar[int]
    vm_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, vm_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListVmsRequest(_message.Message):
    __slots__ = ("cluster", "pool", "states")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    pool: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.VmState]
    def __init__(self, cluster: _Optional[str] = ..., pool: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.VmState, str]]] = ...) -> None: ...

class ListVmsResponse(_message.Message):
    __slots__ = ("vms",)
    VMS_FIELD_NUMBER: _ClassVar[int]
    vms: _containers.RepeatedCompositeFieldContainer[_types_pb2.Vm]
    def __init__(self, vms: _Optional[_Iterable[_Union[_types_pb2.Vm, _Mapping]]] = ...) -> None: ...

class EvictVmRequest(_message.Message):
    __slots__ = ("cluster", "vm_id", "reason")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    vm_id: str
    reason: str
    def __init__(self, cluster: _Optional[str] = ..., vm_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class EvictVmResponse(_message.Message):
    __slots__ = ("vm",)
    VM_FIELD_NUMBER: _ClassVar[int]
    vm: _types_pb2.Vm
    def __init__(self, vm: _Optional[_Union[_types_pb2.Vm, _Mapping]] = ...) -> None: ...

class ListAuditRecordsRequest(_message.Message):
    __slots__ = ("cluster", "identity", "rpc", "outcome", "since", "page_size", "page_token")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    RPC_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    identity: str
    rpc: str
    outcome: str
    since: _timestamp_pb2.Timestamp
    page_size: int
    page_token: str
    def __init__(self, cluster: _Optional[str] = ..., identity: _Optional[str] = ..., rpc: _Optional[str] = ..., outcome: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAuditRecordsResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AuditRecord(_message.Message):
    __slots__ = ("time", "identity", "roles", "rpc", "target", "outcome", "detail", "peer")
    TIME_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    RPC_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    time: _timestamp_pb2.Timestamp
    identity: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    rpc: str
    target: str
    outcome: str
    detail: str
    peer: str
    def __init__(self, time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., identity: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., rpc: _Optional[str] = ..., target: _Optional[str] = ..., outcome: _Optional[str] = ..., detail: _Optional[str] = ..., peer: _Optional[str] = ...) -> None: ...

class SetUserQuotaRequest(_message.Message):
    __slots__ = ("user_id", "gpu_hours_per_week", "max_active_sessions", "max_active_batch_sessions", "clear")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_PER_WEEK_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    gpu_hours_per_week: float
    max_active_sessions: int
    max_active_batch_sessions: int
    clear: bool
    def __init__(self, user_id: _Optional[str] = ..., gpu_hours_per_week: _Optional[float] = ..., max_active_sessions: _Optional[int] = ..., max_active_batch_sessions: _Optional[int] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetUserQuotaResponse(_message.Message):
    __slots__ = ("override", "quota")
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    override: QuotaOverride
    quota: _types_pb2.Quota
    def __init__(self, override: _Optional[_Union[QuotaOverride, _Mapping]] = ..., quota: _Optional[_Union[_types_pb2.Quota, _Mapping]] = ...) -> None: ...

class GetUserQuotaRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetUserQuotaResponse(_message.Message):
    __slots__ = ("override", "quota")
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    override: QuotaOverride
    quota: _types_pb2.Quota
    def __init__(self, override: _Optional[_Union[QuotaOverride, _Mapping]] = ..., quota: _Optional[_Union[_types_pb2.Quota, _Mapping]] = ...) -> None: ...

class QuotaOverride(_message.Message):
    __slots__ = ("user_id", "gpu_hours_per_week", "max_active_sessions", "max_active_batch_sessions", "update_time")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_PER_WEEK_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_ACTIVE_BATCH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    gpu_hours_per_week: float
    max_active_sessions: int
    max_active_batch_sessions: int
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., gpu_hours_per_week: _Optional[float] = ..., max_active_sessions: _Optional[int] = ..., max_active_batch_sessions: _Optional[int] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class BlockUserRequest(_message.Message):
    __slots__ = ("user_id", "reason")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    reason: str
    def __init__(self, user_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BlockUserResponse(_message.Message):
    __slots__ = ("block", "already_blocked")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    ALREADY_BLOCKED_FIELD_NUMBER: _ClassVar[int]
    block: UserBlock
    already_blocked: bool
    def __init__(self, block: _Optional[_Union[UserBlock, _Mapping]] = ..., already_blocked: _Optional[bool] = ...) -> None: ...

class UnblockUserRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class UnblockUserResponse(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: UserBlock
    def __init__(self, block: _Optional[_Union[UserBlock, _Mapping]] = ...) -> None: ...

class GetUserBlockRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetUserBlockResponse(_message.Message):
    __slots__ = ("block", "decisions", "past_blocks")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    PAST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    block: UserBlock
    decisions: _containers.RepeatedCompositeFieldContainer[AbuseDecision]
    past_blocks: _containers.RepeatedCompositeFieldContainer[UserBlock]
    def __init__(self, block: _Optional[_Union[UserBlock, _Mapping]] = ..., decisions: _Optional[_Iterable[_Union[AbuseDecision, _Mapping]]] = ..., past_blocks: _Optional[_Iterable[_Union[UserBlock, _Mapping]]] = ...) -> None: ...

class ListBlockedUsersRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBlockedUsersResponse(_message.Message):
    __slots__ = ("blocks", "next_page_token")
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[UserBlock]
    next_page_token: str
    def __init__(self, blocks: _Optional[_Iterable[_Union[UserBlock, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UserBlock(_message.Message):
    __slots__ = ("user_id", "block_time", "blocked_by", "reason", "evidence", "lift_time", "lifted_by")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TIME_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    LIFT_TIME_FIELD_NUMBER: _ClassVar[int]
    LIFTED_BY_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    block_time: _timestamp_pb2.Timestamp
    blocked_by: str
    reason: str
    evidence: str
    lift_time: _timestamp_pb2.Timestamp
    lifted_by: str
    def __init__(self, user_id: _Optional[str] = ..., block_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., blocked_by: _Optional[str] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., lift_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lifted_by: _Optional[str] = ...) -> None: ...

class AbuseDecision(_message.Message):
    __slots__ = ("session_id", "decision_time", "rules", "reason", "evidence", "dry_run")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_TIME_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    decision_time: _timestamp_pb2.Timestamp
    rules: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    evidence: str
    dry_run: bool
    def __init__(self, session_id: _Optional[str] = ..., decision_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rules: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...
