"""Pages of list answers, shared by the front's and the clusters' services."""

from __future__ import annotations

from provisioner.api import convert
from provisioner.store.audit_log import AuditLog
from provisioner.model.errors import InvalidArgument
from provisioner.v1 import admin_service_pb2 as admin_pb

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# A cluster's List of brief sessions (no history, no notices: a few hundred bytes each, so a page
# stays well under gRPC's 4 MB message limit), which only fronts call: a front's sweep of every
# running session of the fleet would otherwise take a page (and a filtering of every session in
# memory) per 500.
MAX_BRIEF_PAGE_SIZE = 5000


def page_size(requested: int, max_size: int = MAX_PAGE_SIZE) -> int:
    """The size of a page asked for: the default for 0, the maximum for more than the maximum."""
    if requested < 0:
        raise InvalidArgument("page_size must not be negative", field="page_size")
    return min(requested or DEFAULT_PAGE_SIZE, max_size)


def page(items: list, requested_size: int, page_token: str, max_size: int = MAX_PAGE_SIZE) -> tuple[list, str]:
    """Offset pagination over an already ordered list; the token is the next offset."""
    size = page_size(requested_size, max_size)
    try:
        start = int(page_token) if page_token else 0
    except ValueError:
        raise InvalidArgument("malformed page_token", field="page_token") from None
    end = start + size
    return items[start:end], (str(end) if end < len(items) else "")


def audit_page(audit: AuditLog, request) -> admin_pb.ListAuditRecordsResponse:
    """One page of a process's own audit log, as ListAuditRecords asks for it."""
    records, token = audit.list(
        identity=request.identity, rpc=request.rpc, outcome=request.outcome,
        since=request.since.ToNanoseconds() / 1e9 if request.HasField("since") else None,
        page_size=request.page_size, page_token=request.page_token)
    return admin_pb.ListAuditRecordsResponse(records=[convert.audit_record_to_pb(r) for r in records],
                                             next_page_token=token)
