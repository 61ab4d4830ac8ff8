"""Users blocked from new GPU sessions, and the abuse detector's decisions that block them.

A block is a row of the front's store (shared by every front replica), read on each create:
an operator's (`provisioner admin user block`) or the detector's, with the reason and, for the
detector's, the evidence. It stays until an operator clears it. The cluster that flags a session
makes its decision record (provisioner/model/abuse_record.py) and every front hears of it on its
capacity stream; `apply` records it and blocks the user, or, in a dry run, records it only.

A cluster requeues a preempted session by itself, with no create at a front: so the clusters are
told the list of blocked users (`push`), and requeue none of theirs. A front pushes it whole when a
cluster's capacity stream starts (a cluster restarted knows nothing), when a block is set or
lifted at it, and with every budget sweep (so two pushes crossing, from two replicas, are put
right within a sweep).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timezone

from provisioner.model.abuse_record import Decision
from provisioner.api.status import RemoteError
from provisioner.model.errors import UserBlocked, quote
from provisioner.front import cluster_reports
from provisioner.front.attempts import ATTEMPT_TIMEOUT_S
from provisioner.front.coalesced import Coalesced
from provisioner.front.retry import call
from provisioner.front.records import FrontRecords
from provisioner.store import Store
from provisioner.v1 import cluster_service_pb2 as cluster_pb

log = logging.getLogger(__name__)

DETECTOR = "detector"  # who blocked, when the abuse detector did (else the operator's identity)


@dataclass(frozen=True, slots=True)
class Block:
    user_id: str
    blocked_at: float
    blocked_by: str  # an operator's identity, or DETECTOR
    reason: str
    evidence: str  # JSON text, at most MAX_EVIDENCE_CHARS ("" from an operator)

    @classmethod
    def read(cls, store: Store, user_id: str) -> Block | None:
        row = store.blocks.user_block(user_id)
        return cls(*row) if row else None


def refusal(block: Block) -> UserBlocked:
    """The refusal of a blocked user's create. The user is told that and since when, not the
    evidence: a miner told which rule caught it learns how to dodge it. Operators see it all
    (`admin user show`)."""
    who = "abuse detection" if block.blocked_by == DETECTOR else "an operator"
    return UserBlocked(f"user {quote(block.user_id)} may not start GPU sessions: blocked by {who} since "
                       f"{_iso(block.blocked_at)}; an operator can lift the block", field="spec.user_id")


async def apply(store: Store, d: Decision) -> bool:
    """Records the decision, and unless it is a dry run blocks its user (a block already there
    stands), in one durable write. Idempotent by session: whether the decision was new."""
    return await store.commit(store.blocks.record_abuse_decision, d.session_id, d.user_id, d.at, ",".join(d.rules),
                              d.reason, d.evidence, not d.dry_run, DETECTOR)


async def apply_all(store: Store, cluster: str, decisions: list[Decision]) -> int:
    """Applies the flags `cluster` sent (in one transaction, when they arrive together); how many
    were new. Each is logged by the one front replica that recorded it. A flag that fails the
    front's checks (cluster_reports.flag_problem) is dropped and logged; one for a session no
    front made (a cluster's requeue, or an invented id) is recorded but blocks nobody."""
    checked = []
    for d in decisions:
        owner = await store.read(FrontRecords(store).owner_of_session, d.session_id)
        if problem := cluster_reports.flag_problem(cluster, d, owner):
            log.warning("dropped an abuse flag from cluster %s: %s (session %s, user %s)", cluster, problem,
                        d.session_id, d.user_id)
            continue
        if owner is None and not d.dry_run:
            log.warning("abuse flag from cluster %s for session %s, which no front made: recorded, user %s "
                        "not blocked", cluster, d.session_id, d.user_id)
            d = dataclasses.replace(d, dry_run=True)
        checked.append(d)
    decisions = checked
    new = await asyncio.gather(*(apply(store, d) for d in decisions))
    for d, fresh in zip(decisions, new):
        if fresh:
            log.warning("abuse detection flagged session %s of user %s (%s): %s", d.session_id, d.user_id,
                        ", ".join(d.rules), "recorded only (dry run)" if d.dry_run else "user blocked",
                        extra={"session_id": d.session_id})
    return sum(new)


BLOCKS_PAGE = 1000


async def blocked_user_ids(store: Store) -> list[str]:
    """Every blocked user, from the store."""
    users: list[str] = []
    while page := await store.read(store.blocks.blocked_users, BLOCKS_PAGE, len(users)):
        users += [row[0] for row in page]
        if len(page) < BLOCKS_PAGE:
            break
    return users


async def push(store: Store, clients) -> None:
    """Tells each of `clients` (ClusterClients) the whole list of blocked users. A cluster that
    cannot be told now is logged and told at the next push."""
    request = cluster_pb.SetBlockedUsersRequest(user_ids=await blocked_user_ids(store))
    results = await asyncio.gather(*(call(c.sessions.SetBlockedUsers, request, ATTEMPT_TIMEOUT_S)
                                     for c in clients), return_exceptions=True)
    for c, result in zip(clients, results):
        if isinstance(result, RemoteError):
            log.warning("cluster %s was not told the blocked users; the next push tells it: %s", c.name,
                        result.code.name)
        elif isinstance(result, BaseException):
            raise result


class Pusher(Coalesced):
    """Pushes in the background, so that no caller (a capacity stream, an operator's call) waits
    on the clusters; the pushes asked for while one runs make one more after it. A cluster not
    reachable now is told when its capacity stream starts again."""

    def __init__(self, store: Store, clients: dict):
        self.store, self.clients = store, clients  # by name, as Fleet.clients
        super().__init__(lambda: push(self.store, [c for c in self.clients.values() if c.healthy]),
                         "push the blocked users to the clusters")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
