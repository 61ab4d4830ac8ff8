"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import grpc

from provisioner.client import _base, errors
from provisioner.client.credentials import front_credentials, resolve, server_name_options
from provisioner.client.types import Quota, Session, SessionKind, SessionState
from provisioner.common.grpc_options import RECEIVE_BUFFER
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import session_service_pb2_grpc as session_grpc


class Client:
    """SessionService (and, for operators, AdminService) at the front.

    `target` defaults to $PROVISIONER_FRONT, else 127.0.0.1:50051; credentials as in
    `credentials.resolve`. `timeout` bounds each call, retries included; watches have none unless
    given. Give `channel` to bring a channel of your own (credentials and all); `server_name`
    (else $PROVISIONER_SERVER_NAME) is the name checked in the front's certificate instead of the
    host dialled.
    """

    def __init__(self, target: str | None = None, *, token: str | None = None,
                 ca: str | Path | bytes | None = None, data_dir: str | Path | None = None,
                 timeout: float = _base.DEFAULT_TIMEOUT_S, max_attempts: int = _base.MAX_ATTEMPTS,
                 channel: grpc.Channel | None = None, server_name: str | None = None):
        self.target = _base.front_address(target)
        if channel is None:
            creds = resolve(token, ca, data_dir)
            channel = grpc.secure_channel(self.target, front_credentials(creds.ca_pem, creds.token),
                                          options=[*RECEIVE_BUFFER, *server_name_options(server_name)])
        self._channel = channel
        self._sessions = session_grpc.SessionServiceStub(channel)
        self._admin = admin_grpc.AdminServiceStub(channel)
        self.timeout = timeout
        self.max_attempts = max_attempts
        # Between retries, in wall time (call deadlines are wall time); a test may record instead.
        self.sleep: Callable[[float], None] = time.sleep

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the generated API, with retries and typed errors --------------------------------------

    def call(self, method: str, request, *, timeout: float | None = None):
        """One unary RPC of SessionService or AdminService by name (`"GetSession"`), retried while
        retrying is safe and time is left; returns the response message."""
        stub = self._sessions if method in _base.SESSION_METHODS else self._admin
        rpc = getattr(stub, method)
        deadline = time.monotonic() + (timeout or self.timeout)
        attempt = 0
        while True:
            try:
                return rpc(request, timeout=max(0.001, deadline - time.monotonic()))
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
            delay = _base.retry_delay(err, attempt)
            attempt += 1
            if delay is None or attempt >= self.max_attempts or time.monotonic() + delay >= deadline:
                raise err
            self.sleep(delay)

    def watch_messages(self, session_id: str, after_revision: int = 0,
                       timeout: float | None = None) -> Iterator:
        """Every change of a session as a `types_pb2.Session`, resuming after the last revision
        seen when the stream breaks; ends when the server ends the stream (the session ended)."""
        last, place, resumes = after_revision, None, 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            req = session_pb.WatchSessionRequest(session_id=session_id, after_revision=last)
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                for resp in self._sessions.WatchSession(req, timeout=left):
                    resumes = 0
                    if _base.is_new(resp.session, last, place):
                        last, place = max(last, resp.session.revision), resp.session.queue_position
                        yield resp.session
                return
            except grpc.RpcError as e:
                err = errors.from_rpc_error(e)
            delay = _base.resume_delay(err, resumes, deadline)
            resumes += 1
            self.sleep(delay)

    # --- sessions ---------------------------------------------------------------------------------

    def create_session(self, *, user_id: str, accelerator: str, image: str, request_id: str | None = None,
                       kind: SessionKind | None = None, notebook_id: str = "", region: str | None = None,
                       region_required: bool = False, max_runtime: timedelta | float | None = None,
                       priority_class: str = "", requeue_on_preemption: bool = False) -> Session:
        """Starts a session (or returns the one already made for `request_id`). Without a request
        id one is made and reused by every retry; on an error that leaves the outcome unknown
        (`Unavailable`, `DeadlineExceeded`) `err.request_id` says what to retry with.
        `priority_class`: one of the fleet's classes, no higher than the kind's (default: the
        kind's); `requeue_on_preemption`: if preempted, a new session is queued in its place."""
        req = _base.create_request(user_id=user_id, accelerator=accelerator, image=image,
                                   request_id=request_id, kind=kind, notebook_id=notebook_id, region=region,
                                   region_required=region_required, max_runtime=max_runtime,
                                   priority_class=priority_class, requeue_on_preemption=requeue_on_preemption)
        try:
            return Session.from_proto(self.call("CreateSession", req).session)
        except errors.ProvisionerError as e:
            e.request_id = req.spec.request_id
            raise

    def get_session(self, session_id: str) -> Session:
        return Session.from_proto(self.call("GetSession", session_pb.GetSessionRequest(session_id=session_id)).session)

    def list_sessions(self, user_id: str = "", states: Sequence[SessionState] = (), cluster: str = "",
                      page_size: int = 0, with_history: bool = False) -> list[Session]:
        """Sessions newest first, every page: a user's, or ("" with a service or admin token) every
        user's; only `cluster`'s and only in `states` when given; each with its history only
        `with_history`."""
        out, token = [], ""
        while True:
            resp = self.call("ListSessions", _base.list_request(user_id, cluster, states, page_size, token,
                                                                   with_history))
            out += [Session.from_proto(s) for s in resp.sessions]
            if not resp.next_page_token or resp.next_page_token == token:
                return out
            token = resp.next_page_token

    def touch_session(self, session_id: str) -> Session:
        """Records the user's activity, so the session is not ended as idle. Raises `SessionEnded`
        if it is stopping or has ended (touching it brings nothing back)."""
        s = Session.from_proto(self.call("TouchSession", session_pb.TouchSessionRequest(session_id=session_id)).session)
        if s.state in (SessionState.STOPPING, SessionState.STOPPED, SessionState.FAILED):
            raise errors.SessionEnded(s)
        return s

    def stop_session(self, session_id: str, reason: str = "") -> Session:
        return Session.from_proto(self.call(
            "StopSession", session_pb.StopSessionRequest(session_id=session_id, reason=reason)).session)

    def get_quota(self, user_id: str) -> Quota:
        return Quota.from_proto(self.call("GetQuota", session_pb.GetQuotaRequest(user_id=user_id)).quota)

    def watch(self, session_id: str, after_revision: int = 0, timeout: float | None = None) -> Iterator[Session]:
        for s in self.watch_messages(session_id, after_revision, timeout):
            yield Session.from_proto(s)

    def wait_until_running(self, session_id: str, timeout: float,
                           on_progress: Callable[[Session], None] | None = None) -> Session:
        """The session once running. Raises `SessionEnded` if it stops or fails first, and
        `WaitTimeout` if it is not running within `timeout` seconds (both carry its last report).
        `on_progress` sees every change on the way (state, queue position, pull, estimate)."""
        last = None
        try:
            for last in self.watch(session_id, timeout=timeout):
                if on_progress is not None:
                    on_progress(last)
                if last.state is SessionState.RUNNING:
                    return last
                if last.state is not None and last.state.ended:
                    raise errors.SessionEnded(last)
        except errors.DeadlineExceeded:
            raise errors.WaitTimeout(last, timeout) from None
        raise errors.WaitTimeout(last, timeout)
