"""What the sync and asyncio clients share: defaults, request building, the retry rule."""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import timedelta

from provisioner.client import errors
from provisioner.client.types import SessionKind
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2

DEFAULT_FRONT = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 4  # per call, the first included
WATCH_RESUMES = 5  # resumes in a row without a new report before a watch gives up
INITIAL_BACKOFF_S, MAX_BACKOFF_S = 0.2, 5.0

SESSION_METHODS = {"CreateSession", "GetSession", "ListSessions", "WatchSession", "TouchSession",
                   "StopSession", "GetQuota"}


def front_address(target: str | None) -> str:
    return target or os.environ.get("PROVISIONER_FRONT") or DEFAULT_FRONT


def retry_delay(err: errors.ProvisionerError, attempt: int) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None if retrying cannot help. Every call
    is safe to repeat (a create carries its request id), so this looks only at the error: a front
    or cluster that is unreachable or restarting, or no capacity now with the server's advice."""
    if isinstance(err, errors.Unavailable) or (
            type(err) is errors.ResourceExhausted and err.retry_after is not None):
        backoff = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * 2 ** attempt) * random.uniform(0.5, 1.0)
        advised = err.retry_after.total_seconds() if err.retry_after is not None else 0.0
        return max(backoff, advised)
    return None


def resume_delay(err: errors.ProvisionerError, resumes: int, deadline: float | None) -> float:
    """How long to wait before resuming a watch broken by `err` after `resumes` resumes in a row
    without news; raises `err` when resuming cannot help (not UNAVAILABLE, too many, past the
    deadline)."""
    delay = retry_delay(err, resumes) if isinstance(err, errors.Unavailable) else None
    if delay is None or resumes >= WATCH_RESUMES or (deadline is not None and time.monotonic() + delay >= deadline):
        raise err
    return delay


def create_request(*, user_id: str, accelerator: str, image: str, request_id: str | None,
                   kind: SessionKind | None, notebook_id: str, region: str | None,
                   region_required: bool, max_runtime: timedelta | float | None,
                   priority_class: str = "", requeue_on_preemption: bool = False,
                   ) -> session_pb.CreateSessionRequest:
    spec = types_pb2.SessionSpec(
        request_id=request_id or str(uuid.uuid4()), user_id=user_id, accelerator=accelerator, image=image,
        kind=kind._to_pb(types_pb2.SessionKind) if kind else 0, notebook_id=notebook_id,
        region_hint=region or "", region_required=region_required, priority_class=priority_class,
        requeue_on_preemption=requeue_on_preemption)
    if max_runtime is not None:
        spec.max_runtime.FromTimedelta(max_runtime if isinstance(max_runtime, timedelta)
                                       else timedelta(seconds=max_runtime))
    return session_pb.CreateSessionRequest(spec=spec)


def list_request(user_id: str, cluster: str, states, page_size: int, page_token: str,
                 with_history: bool = False) -> session_pb.ListSessionsRequest:
    return session_pb.ListSessionsRequest(
        user_id=user_id, cluster=cluster, states=[s._to_pb(types_pb2.SessionState) for s in states or ()],
        page_size=page_size, page_token=page_token, with_history=with_history)


def is_new(s: types_pb2.Session, last: int, place: int | None = None) -> bool:
    """False for a report already seen before a watch was resumed. A session's place in the
    queue moves without a new revision: a report of the last revision seen (`last`) is new if its
    place differs from the one seen with it (`place`)."""
    if not (last and s.revision and s.revision <= last):
        return True
    return s.revision == last and place is not None and s.queue_position != place
