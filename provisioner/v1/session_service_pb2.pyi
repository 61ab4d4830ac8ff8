import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from provisioner.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.SessionSpec
    def __init__(self, spec: _Optional[_Union[_types_pb2.SessionSpec, _Mapping]] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session", "placement_note")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_NOTE_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    placement_note: str
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ..., placement_note: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("user_id", "states", "page_size", "page_token", "cluster", "created_after", "created_before", "with_history")
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    WITH_HISTORY_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.SessionState]
    page_size: int
    page_token: str
    cluster: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    with_history: bool
    def __init__(self, user_id: _Optional[str] = ..., states: _Optional[_Iterable[_Union[_types_pb2.SessionState, str]]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., cluster: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., with_history: _Optional[bool] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions", "next_page_token")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[_types_pb2.Session]
    next_page_token: str
    def __init__(self, sessions: _Optional[_Iterable[_Union[_types_pb2.Session, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchSessionRequest(_message.Message):
    __slots__ = ("session_id", "after_revision")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    after_revision: int
    def __init__(self, session_id: _Optional[str] = ..., after_revision: _Optional[int] = ...) -> None: ...

class WatchSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class TouchSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class TouchSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class StopSessionRequest(_message.Message):
    __slots__ = ("session_id", "reason")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    reason: str
    def __init__(self, session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class StopSessionResponse(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: _types_pb2.Session
    def __init__(self, session: _Optional[_Union[_types_pb2.Session, _Mapping]] = ...) -> None: ...

class GetQuotaRequest(_message.Message):
    __slots__ = ("user_id",)
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    user_id: str
    def __init__(self, user_id: _Optional[str] = ...) -> None: ...

class GetQuotaResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: _types_pb2.Quota
    def __init__(self, quota: _Optional[_Union[_types_pb2.Quota, _Mapping]] = ...) -> None: ...
