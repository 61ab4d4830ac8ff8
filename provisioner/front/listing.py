"""Listing sessions at the clusters: every page of one cluster's answer, and one call at every
cluster at once. Shared by ListSessions, the quota checks (front/weeks.py) and the budget sweep."""

from __future__ import annotations

import asyncio
import logging

from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, MAX_PAGE_SIZE
from provisioner.model.errors import quote
from provisioner.front.clusters import ClusterClient
from provisioner.front.retry import call
from provisioner.v1 import cluster_service_pb2 as cluster_pb
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
