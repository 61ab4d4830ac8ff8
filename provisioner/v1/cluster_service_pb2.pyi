import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from provisioner.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SetProjectQuotaRequest(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: _types_pb2.ProjectQuota
    def __init__(self, quota: _Optional[_Union[_types_pb2.ProjectQuota, _Mapping]] = ...) -> None: ...

class SetProjectQuotaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetBlockedUsersRequest(_message.Message):
    __slots__ = ("user_ids",)
    USER_IDS_FIELD_NUMBER: _ClassVar[int]
    user_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, user_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SetBlockedUsersResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetBudgetEndRequest(_message.Message):
    __slots__ = ("session_id", "end_time")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    end_time: _timestamp_pb2.Timestamp
    def __init__(self, session_id: _Optional[str] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SetBudgetEndResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("spec", "commit_by")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    COMMIT_BY_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.SessionSpec
    commit_by: _timestamp_pb2.Timestamp
    def __init__(self, spec: _Optional[_Union[_types_pb2.SessionSpec, _Mapping]] = ..., commit_by: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("session_id", "request_id", "user_id", "with_access_token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_ACCESS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request_id: str
    user_id: str
    with_access_token: bool
    def __init__(self, session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., user_id: _Optional[str] = ..., with_access_token: _Optional[bool] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("user_id", "states", "page_size", "page_token", "ended_after", "brief", "created_after", "created_before")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ENDED_AFTER_FIELD_NUMBER: _ClassVar[int]
    BRIEF_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.SessionState]
    page_size: int
    page_token: str
    ended_after: _timestamp_pb2.Timestamp
    brief: bool
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    def __init__(self, user_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.SessionState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., ended_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., brief: _Optional[bool] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_types_pb2.Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_types_pb2.Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class TouchRequest(_message.Message):
    __slots__ = ("session_id", "user_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    user_id: str
    def __init__(self, session_id: _Optional[str] = ..., user_id: _Optional[str] = ...) -> None: ...

class TouchResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("session_id", "reason", "user_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    user_id: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ..., user_id: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("session_id", "after_revision", "user_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_revision: int
    user_id: str
    def __init__(self, session_id: _Optional[str] = ..., after_revision: _Optional[int] = ..., user_id: _Optional[str] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class WatchCapacityRequest(_message.Message):
    __slots__ = ("min_interval_s",)
    MIN_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    min_interval_s: float
    def __init__(self, min_interval_s: _Optional[float] = ...) -> None: ...

class WatchCapacityResponse(_message.Message):
    __slots__ = ("capacity", "changes_only", "abuse_flags")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CHANGES_ONLY_FIELD_NUMBER: _ClassVar[int]
    ABUSE_FLAGS_FIELD_NUMBER: _ClassVar[int]
    capacity: _types_pb2.ClusterCapacity
    changes_only: bool
    abuse_flags: _containers.RepeatedCompositeFieldContainer[AbuseFlag]
    def __init__(self, capacity: _Optional[_Union[_types_pb2.ClusterCapacity, _Mapping]] = ..., changes_only: _Optional[bool] = ..., abuse_flags: _Optional[_Iterable[_Union[AbuseFlag, _Mapping]]] = ...) -> None: ...

class AbuseFlag(_message.Message):
    __slots__ = ("session_id", "user_id", "flag_time", "rules", "reason", "evidence", "dry_run")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_TIME_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    user_id: str
    flag_time: _timestamp_pb2.Timestamp
    rules: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    evidence: str
    dry_run: bool
    def __init__(self, session_id: _Optional[str] = ..., user_id: _Optional[str] = ..., flag_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rules: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., evidence: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class DiscardRequest(_message.Message):
    __slots__ = ("request_id", "reason", "user_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    user_id: str
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ..., user_id: _Optional[str] = ...) -> None: ...

class DiscardResponse(_message.Message):
    __slots__ = ("discarded",)
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    discarded: bool
    def __init__(self, discarded: _Optional[bool] = ...) -> None: ...
