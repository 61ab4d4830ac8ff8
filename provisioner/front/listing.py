"""Listing sessions at the clusters: every page of one cluster's answer, and one call at every
cluster at once (shared by the quota checks, front/weeks.py, and the budget sweep); and
ListSessions, one keyset page (provisioner/api/keyset.py) merged from a page of each cluster. The
next page's token carries each unfinished cluster's position, so any front replica can serve it
and no front keeps anything between pages."""

from __future__ import annotations

import asyncio
import logging

from provisioner.api.keyset import Key, Part, decode_position, decode_positions, encode_position, encode_positions, \
    merge, query_fingerprint
from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, MAX_PAGE_SIZE, page_size
from provisioner.front.cluster_reports import checked
from provisioner.front.clusters import ClusterClient
from provisioner.front.retry import call
from provisioner.model.errors import quote
from provisioner.v1 import cluster_service_pb2 as cluster_pb
from provisioner.v1 import session_service_pb2 as session_pb
from provisioner.v1 import types_pb2 as pb

log = logging.getLogger(__name__)

LIVE_STATES = [pb.SESSION_STATE_QUEUED, pb.SESSION_STATE_PROVISIONING, pb.SESSION_STATE_PULLING_IMAGE,
               pb.SESSION_STATE_STARTING, pb.SESSION_STATE_RUNNING, pb.SESSION_STATE_STOPPING]
KIND_NAMES = {pb.SESSION_KIND_UNSPECIFIED: "interactive", pb.SESSION_KIND_INTERACTIVE: "interactive",
              pb.SESSION_KIND_BATCH: "batch"}


async def listed(c: ClusterClient, request: cluster_pb.ListRequest, timeout: float | None,
                 page_size: int | None = None, pause_s: float = 0.0) -> list[pb.Session]:
    """Every page of one cluster's answer to `request` (pages of `page_size`, default the most a
    cluster gives), waiting `pause_s` of wall time between pages."""
    request.page_size, out = page_size or (MAX_BRIEF_PAGE_SIZE if request.brief else MAX_PAGE_SIZE), []
    while True:
        resp = await call(c.sessions.List, request, timeout)
        out += resp.sessions
        if not resp.next_page_token:
            return out
        request.page_token = resp.next_page_token
        if pause_s:
            # Wall time on purpose: the pause spares the cluster's serving loop, whatever the fleet's clock.
            await asyncio.sleep(pause_s)


async def from_each(clients: list[ClusterClient], one, user_id: str, lenient: bool) -> list[pb.Session]:
    """`one(cluster)` on every cluster at once, added up; with `lenient`, a cluster that fails is
    left out (and logged) instead of failing the call."""
    results = await asyncio.gather(*(one(c) for c in clients), return_exceptions=lenient)
    sessions: list[pb.Session] = []
    for c, r in zip(clients, results):
        if isinstance(r, BaseException):
            if not isinstance(r, Exception):
                raise r
            log.warning("cluster %s did not list the sessions of user %s; they are not counted: %s",
                        c.name, quote(user_id), r)
        else:
            sessions += r
    return sessions


def session_key(s: pb.Session) -> Key:
    return s.create_time.ToNanoseconds(), s.id


def _query(user_id: str, request: session_pb.ListSessionsRequest) -> str:
    return query_fingerprint(user_id, sorted(request.states), request.cluster, request.with_history,
                             request.created_after.ToNanoseconds() if request.HasField("created_after") else None,
                             request.created_before.ToNanoseconds() if request.HasField("created_before") else None)


async def list_page(clients: dict[str, ClusterClient], user_id: str,
                    request: session_pb.ListSessionsRequest) -> session_pb.ListSessionsResponse:
    """A page of the user's sessions ("": every user's) on the clusters `clients` names (all of
    them, or request.cluster), newest first. A cluster that is unreachable now keeps its position
    in the token and is asked again on later pages, while the others have more; one that fails while
    asked fails the call."""
    limit = page_size(request.page_size)
    names = [name for name in clients if request.cluster in ("", name)]
    query = _query(user_id, request)
    resume = decode_positions(request.page_token, query, names)
    if resume is None:  # the first page: every cluster from its start
        resume = {name: None for name in names}
    asked = [name for name in resume if clients[name].healthy]

    async def one(name: str) -> Part:
        c = clients[name]
        resp = await call(c.sessions.List, cluster_pb.ListRequest(
            user_id=user_id, states=request.states, page_size=limit, brief=not request.with_history,
            page_token=encode_position(resume[name]) if resume[name] else "",
            created_after=request.created_after if request.HasField("created_after") else None,
            created_before=request.created_before if request.HasField("created_before") else None), None)
        return Part([checked(name, s) for s in resp.sessions], decode_position(resp.next_page_token))

    parts = await asyncio.gather(*(one(name) for name in asked))
    rows, positions = merge(parts, session_key, limit)
    following: dict[str, Key | None] = {name: p for name, p in zip(asked, positions) if p is not None}
    skipped = [name for name in resume if name not in asked]
    if skipped:  # asked again while the listing goes on; it ends with the reachable clusters' ends
        log.warning("listing the sessions of %s: clusters %s are unreachable", quote(user_id or "*"),
                    ", ".join(skipped))
        if following:
            following.update((name, resume[name]) for name in skipped)
    return session_pb.ListSessionsResponse(
        sessions=rows, next_page_token=encode_positions(query, following) if following else "")
