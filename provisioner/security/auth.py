"""Callers and what they may do: one table, one pure decision.

Roles:
  user     acts only as itself (its user id is its identity): another user's session is
           NOT_FOUND, a request naming another user is PERMISSION_DENIED;
  service  the notebook backend and other internal clients: acts for any user, naming which;
  admin    AdminService, and read access to every session;
  front    the front's certificate: the only caller a cluster accepts.
Anything not in the table is refused (deny by default); health and reflection are anonymous.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

USER, SERVICE, ADMIN, FRONT = "user", "service", "admin", "front"
ROLES = (USER, SERVICE, ADMIN)  # the roles an identity can be given in the config

ANONYMOUS_SERVICES = frozenset({
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
})

SESSIONS = "/provisioner.v1.SessionService/"
ADMIN_SERVICE = "/provisioner.v1.AdminService/"
CLUSTER_SERVICE = "/provisioner.v1.ClusterService/"


@dataclass(frozen=True)
class Caller:
    identity: str  # a token's subject (or configured claim), or the peer certificate's name
    roles: frozenset[str]
    via: str  # how it was authenticated: "token <issuer>" or "certificate"


ANONYMOUS = Caller("anonymous", frozenset(), "none")


class Rule(Enum):
    """Who may call an RPC."""

    SESSION_READ = "session-read"  # user (as itself), service, admin
    SESSION_WRITE = "session-write"  # user (as itself), service
    ADMIN = "admin"
    FRONT = "front"


FRONT_POLICY: dict[str, Rule] = {
    SESSIONS + "CreateSession": Rule.SESSION_WRITE,
    SESSIONS + "GetSession": Rule.SESSION_READ,
    SESSIONS + "ListSessions": Rule.SESSION_READ,
    SESSIONS + "WatchSession": Rule.SESSION_READ,
    SESSIONS + "TouchSession": Rule.SESSION_WRITE,
    SESSIONS + "StopSession": Rule.SESSION_WRITE,
    SESSIONS + "GetQuota": Rule.SESSION_READ,
}
# A cluster is reached only by the front, which has already authorized the end caller.
CLUSTER_POLICY: dict[str, Rule] = {}


def with_admin_service(policy: dict[str, Rule], rule: Rule, methods) -> dict[str, Rule]:
    """`policy` plus every AdminService method under `rule`."""
    return {**policy, **{ADMIN_SERVICE + m: rule for m in methods}}


def with_cluster_service(policy: dict[str, Rule], methods) -> dict[str, Rule]:
    return {**policy, **{CLUSTER_SERVICE + m: Rule.FRONT for m in methods}}


@dataclass(frozen=True)
class Decision:
    allowed: bool
    code: str = ""  # UNAUTHENTICATED or PERMISSION_DENIED when refused
    reason: str = ""
    # The only user whose sessions the call may touch ("" = any): a `user` caller's own id.
    owner: str = ""


def authorize(policy: dict[str, Rule], caller: Caller, method: str, request) -> Decision:
    """Whether `caller` may make this call, and on whose sessions. Pure: no I/O, no clock."""
    rule = policy.get(method)
    if rule is None:
        return Decision(False, "PERMISSION_DENIED", f"{method} is not open to any caller here")
    if caller is ANONYMOUS or not caller.identity:
        return Decision(False, "UNAUTHENTICATED", "credentials are required")
    roles = caller.roles
    if rule is Rule.FRONT:
        return _grant(FRONT in roles, "only the front may call this service")
    if rule is Rule.ADMIN:
        return _grant(ADMIN in roles, "the admin role is required")
    if SERVICE in roles or (rule is Rule.SESSION_READ and ADMIN in roles):
        return Decision(True)
    if USER in roles:
        named = _named_user(request)
        if named and named != caller.identity:
            return Decision(False, "PERMISSION_DENIED", "a user may act only as itself")
        return Decision(True, owner=caller.identity)
    if ADMIN in roles:
        return Decision(False, "PERMISSION_DENIED", "the admin role may read sessions, not change them")
    return Decision(False, "PERMISSION_DENIED", "this identity has no role that allows this call")


def _grant(ok: bool, reason: str) -> Decision:
    return Decision(True) if ok else Decision(False, "PERMISSION_DENIED", reason)


def _named_user(request) -> str:
    """The user a SessionService request names, if any (CreateSession: in its spec)."""
    spec = getattr(request, "spec", None)
    if spec is not None and hasattr(spec, "user_id"):
        return spec.user_id
    return getattr(request, "user_id", "")
