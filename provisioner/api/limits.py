"""Bounds on every field of every request our services accept, checked before a servicer runs.

One table keyed by (message, field) holds a rule for each string, integer and floating-point field
of every request message; enums must be numbers their enum knows, floating-point numbers finite,
repeated fields short. A field left at its default (empty string, zero) is not checked here: the
servicers decide what an empty value means, and refuse it where a value is required.

Pure: protobuf descriptors only, no grpc.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from provisioner.model.images import parse_ref
from provisioner.model.errors import InvalidArgument, quote
from provisioner.common.safe_text import is_printable
from provisioner.v1 import admin_service_pb2, cluster_service_pb2, session_service_pb2

SERVICES = tuple(
    module.DESCRIPTOR.services_by_name[name]
    for module, name in ((session_service_pb2, "SessionService"), (admin_service_pb2, "AdminService"),
                         (cluster_service_pb2, "ClusterService")))

# A server refuses larger requests before decoding them; ours are a few hundred bytes.
MAX_REQUEST_BYTES = 64 * 1024
# Repeated fields without a rule of their own.
MAX_ITEMS = 32

_INT_TYPES = frozenset({FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
                        FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
                        FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64,
                        FieldDescriptor.TYPE_SFIXED32, FieldDescriptor.TYPE_SFIXED64})
_REAL_TYPES = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})


# ---- rules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Text:
    """A string of at most `max_len` characters matching `pattern` (whole) or passing `valid`."""

    max_len: int
    what: str  # the expected format, for the error message
    pattern: re.Pattern | None = None
    valid: Callable[[str], bool] | None = None
    max_items: int = MAX_ITEMS

    def check(self, value: str, field: str) -> None:
        if len(value) > self.max_len:
            raise InvalidArgument(f"{field} is too long: at most {self.max_len} characters, got {len(value)}",
                                  field=field)
        if (self.pattern is not None and not self.pattern.fullmatch(value)) or \
                (self.valid is not None and not self.valid(value)):
            raise InvalidArgument(f"{field} must be {self.what}, got {quote(value)}", field=field)


@dataclass(frozen=True)
class Int:
    lo: int
    hi: int
    max_items: int = MAX_ITEMS

    def check(self, value: int, field: str) -> None:
        if not self.lo <= value <= self.hi:
            raise InvalidArgument(f"{field} must be in {self.lo}..{self.hi}, got {value}", field=field)


@dataclass(frozen=True)
class Real:
    """A finite number in [lo, hi]; 0 (the default) is always accepted."""

    lo: float
    hi: float
    max_items: int = MAX_ITEMS

    def check(self, value: float, field: str) -> None:
        if value != 0 and not self.lo <= value <= self.hi:  # NaN fails the comparison too
            raise InvalidArgument(f"{field} must be a finite number in [{self.lo:g}, {self.hi:g}], got {value!r}",
                                  field=field)


@dataclass(frozen=True)
class Span:
    """A google.protobuf.Duration in [0, max_s]."""

    max_s: int
    max_items: int = MAX_ITEMS

    def check(self, value: Message, field: str) -> None:
        if value.seconds < 0 or value.nanos < 0:
            raise InvalidArgument(f"{field} must not be negative", field=field)
        if value.nanos > 999_999_999 or value.seconds > self.max_s:
            raise InvalidArgument(f"{field} must be at most {self.max_s} s", field=field)


@dataclass(frozen=True)
class Instant:
    """A google.protobuf.Timestamp between 1970 and 9999 (what Timestamp itself allows)."""

    max_items: int = MAX_ITEMS

    def check(self, value: Message, field: str) -> None:
        if not (0 <= value.seconds <= 253_402_300_799 and 0 <= value.nanos <= 999_999_999):
            raise InvalidArgument(f"{field} is not a valid timestamp", field=field)


Rule = Text | Int | Real | Span | Instant

# Cluster and pool names, as clusters/*.yaml declares them (config._NAME): DNS labels.
_NAME = r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?"
NAME = Text(40, "a name of lower-case letters, digits and dashes (e.g. us-central1)", re.compile(_NAME))
# `<cluster>.s-<hex>` (decide.ids.IdSource).
SESSION_ID = Text(128, "a session id (<cluster>.s-<hex>)", re.compile(_NAME + r"\.s-[0-9a-f]{4,64}"))
# The idempotency store keys requests by `user_id/request_id`: neither may hold a slash.
USER_ID = Text(128, "1-128 letters, digits or ._@+-", re.compile(r"[A-Za-z0-9._@+-]{1,128}"))
REQUEST_ID = Text(128, "1-128 printable ASCII characters without spaces or /", re.compile(r"[!-.0-~]{1,128}"))
NOTEBOOK_ID = Text(256, "1-256 printable ASCII characters without spaces", re.compile(r"[!-~]{1,256}"))
REGION = Text(63, "a region name (e.g. us-central1)", re.compile(r"[a-z]+-[a-z]+[0-9]+"))
IMAGE = Text(256, "an image reference, name:version or name:latest (e.g. gpu:v154)",
             valid=lambda v: parse_ref(v) is not None)
# VM ids are GCE instance names (decide.ids.IdSource.vm).
VM_ID = Text(63, "a VM id of lower-case letters, digits and dashes", re.compile(r"[a-z][a-z0-9-]{0,62}"))
# Who called, as the audit log names them (a token's subject, a certificate's name).
IDENTITY = Text(256, "1-256 printable ASCII characters without spaces", re.compile(r"[!-~]{1,256}"))
# What paging.page() issues: the offset of the next page.
PAGE_TOKEN = Text(10, "a page token from an earlier response", re.compile(r"[0-9]{1,10}"))
# What api/keyset.py issues: a position (a cluster's), or a position per cluster (a front's).
KEYSET_TOKEN = Text(8192, "a page token from an earlier response", re.compile(r"[A-Za-z0-9_-]{1,8192}"))
# Free text kept in a session's or VM's history: bounded and printable (safe_text: no control,
# format or separator characters, so no escape sequence, line break or bidi override).
REASON = Text(512, "printable text (no control, format or line-separator characters)", valid=is_printable)
AUTOSCALER = Text(16, "fixed, headroom or predictive", re.compile(r"fixed|headroom|predictive"))
# A Compute quota metric, as an error names it (GPUS_ALL_REGIONS, NVIDIA_T4_GPUS).
QUOTA_METRIC = Text(64, "a quota metric of capital letters, digits and underscores", re.compile(r"[A-Z0-9_]{1,64}"))
PAGE_SIZE = Int(0, 2**31 - 1)  # larger than the maximum means the maximum
REVISION = Int(0, 2**62)
SESSION_CAP = Int(0, 10_000)  # live sessions per user and kind
VM_COUNT = Int(0, 100_000)  # absolute sanity; each pool's ceiling comes from its cluster's config

_SPEC = "provisioner.v1.SessionSpec"

RULES: dict[tuple[str, str], Rule] = {
    (_SPEC, "request_id"): REQUEST_ID,
    (_SPEC, "user_id"): USER_ID,
    (_SPEC, "notebook_id"): NOTEBOOK_ID,
    (_SPEC, "accelerator"): NAME,
    (_SPEC, "image"): IMAGE,
    (_SPEC, "region_hint"): REGION,
    (_SPEC, "max_runtime"): Span(10 * 365 * 24 * 3600),
    (_SPEC, "priority_class"): NAME,
    # SessionService
    ("provisioner.v1.GetSessionRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.ListSessionsRequest", "user_id"): USER_ID,
    ("provisioner.v1.ListSessionsRequest", "page_size"): PAGE_SIZE,
    ("provisioner.v1.ListSessionsRequest", "page_token"): KEYSET_TOKEN,
    ("provisioner.v1.ListSessionsRequest", "created_after"): Instant(),
    ("provisioner.v1.ListSessionsRequest", "created_before"): Instant(),
    ("provisioner.v1.ListSessionsRequest", "cluster"): NAME,
    ("provisioner.v1.WatchSessionRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.WatchSessionRequest", "after_revision"): REVISION,
    ("provisioner.v1.TouchSessionRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.StopSessionRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.StopSessionRequest", "reason"): REASON,
    ("provisioner.v1.GetQuotaRequest", "user_id"): USER_ID,
    # AdminService
    ("provisioner.v1.ListPoolsRequest", "cluster"): NAME,
    ("provisioner.v1.DrainClusterRequest", "cluster"): NAME,
    ("provisioner.v1.UndrainClusterRequest", "cluster"): NAME,
    ("provisioner.v1.SetPoolPolicyRequest", "cluster"): NAME,
    ("provisioner.v1.SetPoolPolicyRequest", "pool"): NAME,
    ("provisioner.v1.PoolPolicy", "min_vms"): VM_COUNT,
    ("provisioner.v1.PoolPolicy", "max_vms"): VM_COUNT,
    ("provisioner.v1.PoolPolicy", "headroom_fraction"): Real(0.0, 100.0),
    ("provisioner.v1.PoolPolicy", "autoscaler"): AUTOSCALER,
    ("provisioner.v1.PrewarmImageRequest", "cluster"): NAME,
    ("provisioner.v1.PrewarmImageRequest", "pool"): NAME,
    ("provisioner.v1.PrewarmImageRequest", "image"): IMAGE,
    ("provisioner.v1.PrewarmImageRequest", "count"): Int(0, 10_000),
    ("provisioner.v1.ListVmsRequest", "cluster"): NAME,
    ("provisioner.v1.ListVmsRequest", "pool"): NAME,
    ("provisioner.v1.EvictVmRequest", "cluster"): NAME,
    ("provisioner.v1.EvictVmRequest", "vm_id"): VM_ID,
    ("provisioner.v1.EvictVmRequest", "reason"): REASON,
    ("provisioner.v1.ListAuditRecordsRequest", "cluster"): NAME,
    ("provisioner.v1.ListAuditRecordsRequest", "identity"): IDENTITY,
    ("provisioner.v1.ListAuditRecordsRequest", "rpc"): Text(
        128, "an RPC name (DrainCluster or /provisioner.v1.AdminService/DrainCluster)",
        re.compile(r"(/[A-Za-z0-9.]+/)?[A-Za-z0-9]+")),
    ("provisioner.v1.ListAuditRecordsRequest", "outcome"): Text(
        32, "ok, denied or a status code name", re.compile(r"[A-Za-z_]+")),
    ("provisioner.v1.ListAuditRecordsRequest", "since"): Instant(),
    ("provisioner.v1.ListAuditRecordsRequest", "page_size"): PAGE_SIZE,
    ("provisioner.v1.ListAuditRecordsRequest", "page_token"): Text(
        256, "a page token from an earlier response", re.compile(r"[A-Za-z0-9_=-]+")),
    ("provisioner.v1.SetUserQuotaRequest", "user_id"): USER_ID,
    ("provisioner.v1.SetUserQuotaRequest", "gpu_hours_per_week"): Real(0.0, 7 * 24 * 64),  # 64 GPUs all week
    ("provisioner.v1.SetUserQuotaRequest", "max_active_sessions"): SESSION_CAP,
    ("provisioner.v1.SetUserQuotaRequest", "max_active_batch_sessions"): SESSION_CAP,
    ("provisioner.v1.GetUserQuotaRequest", "user_id"): USER_ID,
    ("provisioner.v1.BlockUserRequest", "user_id"): USER_ID,
    ("provisioner.v1.BlockUserRequest", "reason"): REASON,
    ("provisioner.v1.UnblockUserRequest", "user_id"): USER_ID,
    ("provisioner.v1.GetUserBlockRequest", "user_id"): USER_ID,
    ("provisioner.v1.ListBlockedUsersRequest", "page_size"): PAGE_SIZE,
    ("provisioner.v1.ListBlockedUsersRequest", "page_token"): PAGE_TOKEN,
    # ClusterService
    ("provisioner.v1.AllocateRequest", "commit_by"): Instant(),
    ("provisioner.v1.GetRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.GetRequest", "request_id"): REQUEST_ID,
    ("provisioner.v1.GetRequest", "user_id"): USER_ID,
    ("provisioner.v1.ListRequest", "user_id"): USER_ID,
    ("provisioner.v1.ListRequest", "page_size"): PAGE_SIZE,
    ("provisioner.v1.ListRequest", "page_token"): KEYSET_TOKEN,
    ("provisioner.v1.ListRequest", "created_after"): Instant(),
    ("provisioner.v1.ListRequest", "created_before"): Instant(),
    ("provisioner.v1.ListRequest", "ended_after"): Instant(),
    ("provisioner.v1.SetBudgetEndRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.SetBudgetEndRequest", "end_time"): Instant(),
    # The whole list of blocked users, as the front pushes it (within the request's byte limit).
    ("provisioner.v1.SetBlockedUsersRequest", "user_ids"): Text(USER_ID.max_len, USER_ID.what, USER_ID.pattern,
                                                               max_items=10_000),
    ("provisioner.v1.ProjectQuota", "until"): Instant(),
    ("provisioner.v1.ProjectQuota", "metric"): QUOTA_METRIC,
    ("provisioner.v1.ProjectQuota", "cluster"): NAME,
    ("provisioner.v1.TouchRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.TouchRequest", "user_id"): USER_ID,
    ("provisioner.v1.StopRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.StopRequest", "user_id"): USER_ID,
    ("provisioner.v1.StopRequest", "reason"): REASON,
    ("provisioner.v1.WatchRequest", "session_id"): SESSION_ID,
    ("provisioner.v1.WatchRequest", "user_id"): USER_ID,
    ("provisioner.v1.WatchRequest", "after_revision"): REVISION,
    # A tiny interval would make the stream a busy loop.
    ("provisioner.v1.WatchCapacityRequest", "min_interval_s"): Real(0.05, 3600.0),
    ("provisioner.v1.DiscardRequest", "request_id"): REQUEST_ID,
    ("provisioner.v1.DiscardRequest", "reason"): REASON,
    ("provisioner.v1.DiscardRequest", "user_id"): USER_ID,
}


# ---- the check -----------------------------------------------------------------------------

def check_request(message: Message) -> None:
    """Raises InvalidArgument naming the first field of `message` that breaks its rule."""
    _check(message, "")


def _check(message: Message, prefix: str) -> None:
    owner = message.DESCRIPTOR.full_name
    for field, value in message.ListFields():
        path = prefix + field.name
        rule = RULES.get((owner, field.name))
        if field.is_repeated:
            limit = rule.max_items if rule is not None else MAX_ITEMS
            if len(value) > limit:
                raise InvalidArgument(f"{path} has too many items: at most {limit}, got {len(value)}", field=path)
            for item in value:
                _check_value(field, rule, item, path)
        else:
            _check_value(field, rule, value, path)


def _check_value(field: FieldDescriptor, rule: Rule | None, value, path: str) -> None:
    if field.type == FieldDescriptor.TYPE_ENUM:
        if value not in field.enum_type.values_by_number:
            raise InvalidArgument(f"{path}: unknown {field.enum_type.name} value {value}", field=path)
    elif field.type == FieldDescriptor.TYPE_MESSAGE and rule is None:
        _check(value, path + ".")
    elif field.type in _REAL_TYPES and not math.isfinite(value):
        raise InvalidArgument(f"{path} must be a finite number, got {value!r}", field=path)
    elif rule is not None:
        rule.check(value, path)
    elif field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        # A field added without a rule (tests/test_limits.py fails on it meanwhile): still bounded.
        if len(value) > 256:
            raise InvalidArgument(f"{path} is too long: at most 256 characters, got {len(value)}", field=path)


# ---- what the table must cover -------------------------------------------------------------

def request_messages() -> Iterator[Descriptor]:
    """Every message type reachable from a request of our services, once each."""
    seen: set[str] = set()

    def walk(desc: Descriptor) -> Iterator[Descriptor]:
        if desc.full_name in seen or desc.full_name.startswith("google.protobuf."):
            return
        seen.add(desc.full_name)
        yield desc
        for field in desc.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE and (desc.full_name, field.name) not in RULES:
                yield from walk(field.message_type)

    for service in SERVICES:
        for method in service.methods:
            yield from walk(method.input_type)


def needs_rule(field: FieldDescriptor) -> bool:
    """Fields whose bounds only a rule can say: strings, bytes, integers, and well-known messages."""
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES) or field.type in _INT_TYPES:
        return True
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.full_name.startswith("google.protobuf.")
