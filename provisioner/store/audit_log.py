"""The audit log: every operator action and every refused call, durably, with who, what, when and
how it ended. Written through the store (one row per record), read newest first in pages.

No gRPC here: the caller passes the RPC's full name and the outcome as text (`ok`, `denied`, or
a gRPC status code name such as `NOT_FOUND`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from dataclasses import dataclass

from provisioner.common.clock import Clock
from provisioner.model.errors import InvalidArgument
from provisioner.store.engine import Store

MAX_TEXT = 256  # characters kept of each string of a record
MAX_ROLES = 16
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
OK, DENIED = "ok", "denied"
DEFAULT_RETENTION_S = 90 * 86400.0
PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class AuditRecord:
    time: float  # the clock's now when it was appended
    identity: str  # who called, as authenticated
    roles: tuple[str, ...]
    rpc: str  # the RPC's full name, e.g. /provisioner.v1.AdminService/DrainCluster
    target: str  # what it acted on, e.g. "cluster=europe-west4 pool=gpu-p100"
    outcome: str  # ok, denied, or a gRPC status code name
    detail: str
    peer: str = ""  # the caller's address, as gRPC gives it (ipv4:10.0.0.5:41234)


def clean(text: str) -> str:
    """At most MAX_TEXT characters, each printable: callers' strings go in as they came, and a
    control character (NUL, a newline) must neither break the store nor forge a line of output."""
    text = str(text)[:MAX_TEXT]
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


class AuditLog:
    """One process's audit log. `source` names it when several processes share one database (a
    cluster's name; empty for the front): each lists only its own records. Records older than
    `retention_s` are dropped, at most once every PRUNE_EVERY_S, by the next record written."""

    def __init__(self, store: Store, clock: Clock, source: str = "", retention_s: float = DEFAULT_RETENTION_S):
        self.store = store
        self.clock = clock
        self.source = source
        self.retention_s = retention_s
        self._pruned_at = -math.inf

    def append(self, identity: str, roles, rpc: str, target: str, outcome: str, detail: str = "",
               peer: str = "") -> None:
        """Writes one record, durably, before returning (in its own transaction, on this thread)."""
        self.store.audit.append_audit(*self._row(identity, roles, rpc, target, outcome, detail, peer))
        if (before := self._prune_due()) is not None:
            self.store.audit.prune_audit(self.source, before)

    async def record(self, identity: str, roles, rpc: str, target: str, outcome: str, detail: str = "",
                     peer: str = "") -> None:
        """`append` through the store's group commit: returns once the record is durable, without
        blocking the event loop meanwhile (other calls' writes share its transaction)."""
        await self.store.commit(self.store.audit.append_audit, *self._row(identity, roles, rpc, target, outcome, detail,
                                                                     peer))
        if (before := self._prune_due()) is not None:
            await self.store.commit(self.store.audit.prune_audit, self.source, before)

    def _prune_due(self) -> float | None:
        """The time before which records go, when a prune is due now."""
        now = self.clock.now()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return None
        self._pruned_at = now
        return now - self.retention_s

    def _row(self, identity: str, roles, rpc: str, target: str, outcome: str, detail: str, peer: str) -> tuple:
        """The record's columns, cleaned, timed now (not when the writer gets to it)."""
        rpc = clean(rpc)
        return (uuid.uuid4().hex, self.source, self.clock.now(), clean(identity),
                json.dumps([clean(r) for r in tuple(roles)[:MAX_ROLES]]), rpc, rpc.rsplit("/", 1)[-1],
                clean(target), clean(outcome), clean(detail), clean(peer))

    def list(self, *, identity: str | None = None, rpc: str | None = None, outcome: str | None = None,
             since: float | None = None, until: float | None = None, page_size: int = DEFAULT_PAGE_SIZE,
             page_token: str = "") -> tuple[list[AuditRecord], str]:
        """Records newest first, and the token of the next page ("" after the last).

        Filters are exact; empty ones are ignored. `rpc` is a full name
        (/provisioner.v1.AdminService/DrainCluster) or just the method (DrainCluster). `since` is
        inclusive, `until` exclusive. `page_size` 0 means 50; at most 500.
        """
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative", field="page_size")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        before = _decode_token(page_token) if page_token else None
        by_method = bool(rpc) and "/" not in rpc
        rows = self.store.audit.audit_records(
            self.source, identity=identity or None, rpc=None if by_method else rpc or None,
            method=rpc if by_method else None, outcome=outcome or None, since=since, until=until,
            before=before, limit=size + 1)
        more = len(rows) > size
        rows = rows[:size]
        records = [AuditRecord(at, who, tuple(json.loads(roles)), name, target, out, detail, peer)
                   for _, at, who, roles, name, target, out, detail, peer in rows]
        token = _encode_token(rows[-1][1], rows[-1][0]) if more else ""
        return records, token


def _encode_token(at: float, record_id: str) -> str:
    """The last record of a page, as an opaque string: the next page starts below it."""
    return base64.urlsafe_b64encode(json.dumps([at, record_id]).encode()).decode().rstrip("=")


def _decode_token(token: str) -> tuple[float, str]:
    try:
        at, record_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) \
                or not isinstance(record_id, str):
            raise ValueError(token)
        return float(at), record_id
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("malformed page_token", field="page_token") from None
