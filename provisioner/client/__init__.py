"""A typed client of the provisioner's API, for the notebook backend and other services.

Needs only grpcio, protobuf and googleapis-common-protos (`pip install provisioner`; the server
is `provisioner[server]`)::

    from provisioner.client import Client
    with Client("front.example:443", token=...) as api:
        s = api.create_session(user_id="ada", accelerator="gpu-p100", image="gpu:v154")
        s = api.wait_until_running(s.id, timeout=900)

`AsyncClient` (in `provisioner.client.aio`, also exported here) has the same calls for asyncio.
"""

from provisioner.client._sync import Client
from provisioner.client.aio import AsyncClient
from provisioner.client.credentials import Credentials, resolve
from provisioner.client.errors import (
    Aborted,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NoCredentials,
    NotFound,
    PermissionDenied,
    ProvisionerError,
    QuotaExceeded,
    ResourceExhausted,
    SessionEnded,
    Unauthenticated,
    Unavailable,
    UserBlocked,
    WaitTimeout,
)
from provisioner.client.types import Notice, Pull, Quota, Session, SessionKind, SessionState, StartKind, StateChange

__all__ = [
    "Aborted", "AsyncClient", "Client", "Credentials", "DeadlineExceeded", "FailedPrecondition", "Internal",
    "InvalidArgument", "NoCredentials", "Notice", "NotFound", "PermissionDenied", "ProvisionerError", "Pull", "Quota",
    "QuotaExceeded", "ResourceExhausted", "Session", "SessionEnded", "SessionKind", "SessionState", "StartKind",
    "StateChange", "Unauthenticated", "Unavailable", "UserBlocked", "WaitTimeout", "resolve",
]
