"""The server's edge: every call is decoded, bounded, authenticated and authorized here, before
any servicer sees it.

One guard per server, wrapped around each method's handler, turns credentials (a bearer token
at the front, the peer's certificate at a cluster) into a typed `Caller`, decodes the request
itself (so undecodable bytes are INVALID_ARGUMENT, not a traceback), checks its limits, asks the
pure `authorize`, and hands the servicer the caller and the user it may act for (`current()`).
Admin actions and the refused calls of known callers go to the audit log (with the caller's
address); calls refused for want of a credential are counted and sampled into the log instead. Health and reflection stay anonymous.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError
from opentelemetry import trace

from provisioner.api import limits
from provisioner.common.pacing import Pacer
from provisioner.api.status import abort
from provisioner.store.audit_log import DENIED, OK, AuditLog
from provisioner.model.errors import InvalidArgument, PermissionDenied, ProvisionerError, QuotaExceeded, Unauthenticated
from provisioner.security.auth import ADMIN_SERVICE, ANONYMOUS, ANONYMOUS_SERVICES, Caller, Decision, Rule, authorize
from provisioner.security.tokens import TokenVerifier

log = logging.getLogger(__name__)

# At most one log line this often (wall seconds) about calls refused for want of a credential.
UNAUTHENTICATED_LOG_S = 10.0

ATTR_CALLER, ATTR_ROLES = "provisioner.caller", "provisioner.caller.roles"
# Callers remembered by the names in their certificates (a cluster's peers: fronts, operators).
MAX_PEERS_KNOWN = 256


@dataclass(frozen=True)
class Access:
    """What the servicer gets: who called, and the only user whose sessions it may touch ("" = any)."""

    caller: Caller
    owner: str = ""


_ACCESS: ContextVar[Access | None] = ContextVar("provisioner_access", default=None)


def current() -> Access:
    """The access of the call being served. Outside a guarded call (an in-process test of a
    servicer) there is none, which is a bug: refuse rather than serve unguarded."""
    access = _ACCESS.get()
    if access is None:
        raise PermissionDenied("no authenticated caller")
    return access


Identify = Callable[[grpc.aio.ServicerContext], Awaitable[Caller]]


def bearer_identity(verifier: TokenVerifier) -> Identify:
    """At the front: the caller is whoever the `authorization: Bearer <JWT>` token names."""

    async def identify(context: grpc.aio.ServicerContext) -> Caller:
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                scheme, _, token = value.partition(" ")
                if scheme.lower() != "bearer":
                    raise Unauthenticated("the authorization header must be 'Bearer <token>'")
                break
        token = token.strip()
        if not token:
            return ANONYMOUS
        if (caller := verifier.verify_here(token)) is not None:
            return caller
        # A first sight of a token may fetch the issuer's keys: off the event loop.
        return await asyncio.to_thread(verifier.verify, token)

    return identify


def certificate_identity(names_to_roles: dict[str, frozenset[str]]) -> Identify:
    """At a cluster: the caller is the name in its verified client certificate (mTLS)."""

    known: dict[tuple, Caller] = {}  # by the names a verified certificate carries: few peers

    async def identify(context: grpc.aio.ServicerContext) -> Caller:
        auth = context.auth_context() or {}
        key = (*auth.get("x509_subject_alternative_name", ()), b"", *auth.get("x509_common_name", ()))
        if (caller := known.get(key)) is None:
            caller = _certificate_caller(auth, names_to_roles)
            if len(known) < MAX_PEERS_KNOWN:
                known[key] = caller
        return caller

    return identify


def _certificate_caller(auth: dict, names_to_roles: dict[str, frozenset[str]]) -> Caller:
    names = [n.decode(errors="replace") for n in auth.get("x509_subject_alternative_name", ())]
    names += [n.decode(errors="replace") for n in auth.get("x509_common_name", ())]
    for name in names:
        if name in names_to_roles:
            return Caller(name, names_to_roles[name], "certificate")
    return Caller(names[0], frozenset(), "certificate") if names else ANONYMOUS


class Guard:
    """Wraps each of a server's method handlers (`wrap`, see api/wrapping.py)."""

    def __init__(self, policy: dict[str, Rule], identify: Identify, audit: AuditLog | None = None,
                 max_streams: Callable[[Caller], int] | None = None, wall: Callable[[], float] = time.monotonic,
                 pacer: Pacer | None = None):
        """`wall` paces the log lines of unauthenticated refusals: wall time on purpose, since a
        log's rate is read by people. `pacer` holds those refusals before they are answered."""
        self.pacer = pacer or Pacer(0)
        self.policy = policy
        self.identify = identify
        self.audit = audit
        self.max_streams = max_streams
        self._streams: dict[str, int] = {}  # open streams by caller identity
        # Refused calls by (method, code), for the metrics; unauthenticated ones are kept only here.
        self.refusals: Counter[tuple[str, str]] = Counter()
        self.wall = wall
        self._unheard = 0  # unauthenticated refusals since the last log line about them
        self._logged_at = -math.inf

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler | None:
        if method.split("/")[1] in ANONYMOUS_SERVICES:
            return handler
        return self._guard(method, handler)

    def _guard(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler | None:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler), response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._stream(method, handler), response_serializer=handler.response_serializer)
        return None  # no RPC of ours streams requests: UNIMPLEMENTED

    def _unary(self, method: str, handler: grpc.RpcMethodHandler):
        async def behavior(raw: bytes, context: grpc.aio.ServicerContext):
            request, access = await self._admit(method, handler, raw, context)
            token = _ACCESS.set(access)
            outcome = OK
            try:
                return await handler.unary_unary(request, context)
            except BaseException:
                outcome = _code_name(context)
                raise
            finally:
                _ACCESS.reset(token)
                if self.audit is not None and is_admin_action(method):
                    await self._audit(access.caller, method, request, outcome, context=context)

        return behavior

    def _stream(self, method: str, handler: grpc.RpcMethodHandler):
        async def behavior(raw: bytes, context: grpc.aio.ServicerContext):
            request, access = await self._admit(method, handler, raw, context)
            identity = access.caller.identity
            cap = self.max_streams(access.caller) if self.max_streams else None
            if cap is not None and self._streams.get(identity, 0) >= cap:
                await self._refuse(context, access.caller, method,
                                   QuotaExceeded(f"at most {cap} open streams per caller", retry_after_s=5.0))
            self._streams[identity] = self._streams.get(identity, 0) + 1
            # Not reset: the call's task (and its context) ends with the stream, and a stream the
            # client left may be closed from another task, where a reset would raise.
            _ACCESS.set(access)
            try:
                async for item in handler.unary_stream(request, context):
                    yield item
            finally:
                self._streams[identity] -= 1
                if not self._streams[identity]:
                    del self._streams[identity]

        return behavior

    async def _admit(self, method: str, handler, raw: bytes, context) -> tuple[object, Access]:
        """Identify, decode, bound, authorize: the request and the caller's access, or an abort."""
        try:
            caller = await self.identify(context)
        except ProvisionerError as err:
            await self._refuse(context, ANONYMOUS, method, err)
        span = trace.get_current_span()
        span.set_attributes({ATTR_CALLER: caller.identity, ATTR_ROLES: ",".join(sorted(caller.roles))})
        # Who may call this at all is decided before the request is even decoded; then what it asks.
        await self._decide(context, caller, method, None)
        try:
            request = handler.request_deserializer(raw)
        except (DecodeError, ValueError, TypeError):
            await abort(context, InvalidArgument("the request could not be decoded"))
        decision = await self._decide(context, caller, method, request)
        try:
            limits.check_request(request)
        except InvalidArgument as err:
            await abort(context, err)
        return request, Access(caller, decision.owner)

    async def _decide(self, context, caller: Caller, method: str, request) -> Decision:
        decision = authorize(self.policy, caller, method, request)
        if not decision.allowed:
            err = (Unauthenticated if decision.code == "UNAUTHENTICATED" else PermissionDenied)(decision.reason)
            await self._refuse(context, caller, method, err, request)
        return decision

    async def _refuse(self, context, caller: Caller, method: str, err: ProvisionerError, request=None):
        self.refusals[method.rsplit("/", 1)[-1], err.grpc_code] += 1
        if caller is ANONYMOUS or isinstance(err, Unauthenticated):
            # No credential that checks out: anyone on the network can send these as fast as they
            # like, so they are counted and sampled into the log, never one durable row each.
            self._note_unauthenticated(context, method, err)
            await self.pacer.pause()
        elif self.audit is not None and not isinstance(err, QuotaExceeded):
            # Durable before the refusal is answered, as an action's record is before its answer:
            # a caller told no has its try on record even if this process dies right after. The
            # wait is a group commit's, off the event loop, so a flood of refusals shares batches.
            await self._audit(caller, method, request, DENIED, err.message, context=context)
        trace.get_current_span().add_event("refused", {"code": err.grpc_code, "reason": err.message})
        await abort(context, err)

    def _note_unauthenticated(self, context, method: str, err: ProvisionerError) -> None:
        """One log line per UNAUTHENTICATED_LOG_S at most, with this caller's address and how many
        such refusals the lines before it left out."""
        self._unheard += 1
        now = self.wall()
        if now - self._logged_at < UNAUTHENTICATED_LOG_S:
            return
        log.warning("refused an unauthenticated call to %s from %s: %s (%d such refusals since the last line)",
                    method, context.peer(), err.message, self._unheard)
        self._logged_at, self._unheard = now, 0

    async def _audit(self, caller: Caller, method: str, request, outcome: str, detail: str = "", *,
                     context=None) -> None:
        try:
            # Shielded: a call its client cancelled still leaves its record.
            peer = context.peer() if context is not None else ""
            await asyncio.shield(self.audit.record(caller.identity, sorted(caller.roles), method, _target(request),
                                                   outcome, detail, peer))
        except Exception:
            # The action itself is done (or refused); a failed audit write must not change its answer.
            log.exception("audit record for %s by %s could not be written", method, caller.identity)


def is_admin_action(method: str) -> bool:
    """AdminService calls that change something (drain, policy, prewarm, evict...): audited.
    Its List* and Get* reads are not, or every status poll would fill the log."""
    return method.startswith(ADMIN_SERVICE) and not method.removeprefix(ADMIN_SERVICE).startswith(("List", "Get"))


def _target(request) -> str:
    """What an admin call acted on, in a few words (cluster, pool, vm, image...)."""
    if request is None:
        return ""
    parts = []
    for name in ("cluster", "pool", "vm_id", "image", "count", "session_id", "user_id"):
        value = getattr(request, name, None)
        if value:
            parts.append(f"{name}={value}")
    return " ".join(parts)


def _code_name(context) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "CANCELLED" if code is None else str(code)


def stream_caps(caps_by_role: dict[str, int]) -> Callable[[Caller], int]:
    """A caller may hold as many streams as its broadest role allows."""

    def cap(caller: Caller) -> int:
        return max((caps_by_role.get(r, 0) for r in caller.roles), default=0) or min(caps_by_role.values())

    return cap
